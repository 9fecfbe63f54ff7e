// SocketStream: a pair's bytes over its TCP connection. Non-blocking reads and writes with
// errno semantics (EAGAIN when nothing can move now); a waiting thread sleeps in poll() on the
// socket. The socket itself is the pair's (it outlives neither).
//
// It offers the same calls as the shared-memory stream (shm/ring_stream.h), so that the pair
// never asks which stream it has; those about doorbells and bells do nothing here, since the
// socket itself tells the event loop and a waiting thread of data and room.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

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

  // The socket carries the messages: the event loop and a sleeping waiter watch it for room
  // as well as data, and a thread polling the pair takes it out of the loop.
  static constexpr bool kSocketCarriesData = true;
  void begin_event() {}
  void end_event() {}
  bool ask_to_be_told(bool /*want_data*/, bool /*want_room*/) { return true; }
  void quiet() {}
  void add_sleeper() {}
  void remove_sleeper() {}
  void wake_sleepers() {}
  std::atomic<uint32_t>* bell() { return nullptr; }  // a waiter polls the socket instead
  bool sends_in_one_copy(size_t /*bytes*/) { return false; }

 private:
  int fd_;
};

}  // namespace dtrain::transport::tcp
