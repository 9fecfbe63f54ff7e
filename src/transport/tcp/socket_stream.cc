#include "transport/tcp/socket_stream.h"

#include <sys/socket.h>

#include <algorithm>
#include <climits>
#include <fstream>

#include "common/socket.h"

namespace dtrain::transport::tcp {
namespace {

// Whether the kernel lets a socket have `bytes` of each buffer.
bool socket_buffers_allowed(int bytes) {
  static const long long cap = [] {
    long long least = LLONG_MAX;
    for (const char* path : {"/proc/sys/net/core/wmem_max", "/proc/sys/net/core/rmem_max"}) {
      std::ifstream f(path);
      long long max = 0;
      least = (f >> max) ? std::min(least, max) : 0;
    }
    return least;
  }();
  return cap >= bytes;
}

}  // namespace

SocketStream::SocketStream(int fd, bool same_host) : fd_(fd) {
  // Fixed socket buffers instead of the kernel's autotuning, which starts small and grows
  // slowly. Only where net.core.wmem_max/rmem_max allow them: capped lower, fixed buffers would
  // be smaller than what autotuning reaches on a long link. Over loopback there is no link to
  // fill, and less in flight stays in cache: smaller ones there (docs/performance.md, "The
  // transport's settings").
  const int buffer = same_host ? kLoopbackSocketBufferBytes : kSocketBufferBytes;
  if (socket_buffers_allowed(buffer)) net::set_buffer_sizes(fd_, buffer);
  // Over loopback a pacing BBR is slower than Reno, and unsteady from one run to the next
  // (same section).
  if (same_host) net::use_loopback_congestion_control(fd_);
}

ssize_t SocketStream::write(const iovec* iov, size_t count) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = count;
  return ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

ssize_t SocketStream::read(std::byte* out, size_t n) { return ::recv(fd_, out, n, MSG_DONTWAIT); }

}  // namespace dtrain::transport::tcp
