// Whether the other end of a connection has closed it, for tests of servers that drop clients.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>

#include "common/deadline.h"

namespace dtrain::testing {

// True when the other side closes `fd` (EOF or reset) within `limit`; what it sends before is
// read and dropped.
inline bool closed_by_peer(int fd, std::chrono::milliseconds limit) {
  const Deadline d = Deadline::after(limit);
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int pr = ::poll(&p, 1, d.poll_ms());
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) return false;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EINTR) return errno == ECONNRESET;
  }
}

}  // namespace dtrain::testing
