// Which connection a server closes when too many sit in their handshake.
// Every listening side (the store, the parameter server, a rank's port at rendezvous) bounds the
// connections still in their handshake, per source host and in all, so that silent sockets (a
// port scanner, a stuck client) cannot hold it up. When one more arrives, one is closed: the
// oldest that has sent nothing, since a real client sends its whole hello the moment it
// connects. Closing the oldest regardless closed a real peer that arrived amid a flood of
// silent ones before its handshake thread ran (on a busy machine, a few milliseconds).
#pragma once

#include <poll.h>
#include <sys/ioctl.h>

#include <atomic>
#include <cerrno>
#include <iterator>

#include "common/deadline.h"

namespace dtrain::net {

// Whether bytes from the client wait on `fd`, not yet read.
inline bool input_waiting(int fd) {
  int bytes = 0;
  return ::ioctl(fd, FIONREAD, &bytes) == 0 && bytes > 0;
}

// Waits until the client on `fd` sends something (or hangs up), then sets `spoke`: call before
// reading its handshake, so that a connection whose bytes were read already is not taken for
// a silent one. Returns at the deadline either way; the handshake then reports the timeout.
inline void note_first_input(int fd, const Deadline& deadline, std::atomic<bool>& spoke) {
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, deadline.poll_ms());
    if (rc < 0 && errno == EINTR) continue;
    if (rc > 0 && (p.revents & POLLIN) != 0) spoke = true;
    if (rc != 0 || deadline.expired()) return;
  }
}

// The connection to close, of `in_arrival_order` (a range of pointers): of those `open(c)`
// says are still in their handshake, the oldest that has not spoken, else the oldest.
// Returns nullptr when none is.
template <class Range, class Open>
auto handshake_to_close(const Range& in_arrival_order, Open open)
    -> decltype(&**std::begin(in_arrival_order)) {
  decltype(&**std::begin(in_arrival_order)) oldest = nullptr;
  for (const auto& c : in_arrival_order) {
    if (!open(*c)) continue;
    if (!c->spoke && !input_waiting(c->fd.get())) return &*c;
    if (oldest == nullptr) oldest = &*c;
  }
  return oldest;
}

}  // namespace dtrain::net
