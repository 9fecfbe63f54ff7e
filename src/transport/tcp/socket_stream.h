// SocketStream: a pair's bytes over its TCP connection. Non-blocking reads and writes with
// errno semantics (EAGAIN when nothing can move now); a waiting thread sleeps in poll() on the
// socket. The socket itself is the pair's (it outlives neither).
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>

namespace dtrain::transport::tcp {

class SocketStream {
 public:
  // SO_SNDBUF/SO_RCVBUF to other hosts, and over loopback (see the constructor).
  static constexpr int kSocketBufferBytes = 2 << 20;
  static constexpr int kLoopbackSocketBufferBytes = 512 << 10;

  // Sets the socket's buffers and congestion control for a peer on this host or another.
  SocketStream(int fd, bool same_host);

  ssize_t write(const iovec* iov, size_t count);
  ssize_t read(std::byte* out, size_t n);
  int fd() const { return fd_; }

 private:
  int fd_;
};

}  // namespace dtrain::transport::tcp
