// What every fuzz target shares: the input delivered on a socket, as a peer would send it.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

#include "common/socket.h"

namespace dtrain::fuzz {

// A connected socket pair; `data` is written into one end, which is then shut for writing (the
// peer "hangs up" after its bytes), and the other end is returned for the parser to read.
// Inputs are capped at what the socket buffer holds, so the write never blocks.
struct Delivered {
  net::Fd ours;    // the parser reads (and may answer) here
  net::Fd theirs;  // kept open so that answers do not raise SIGPIPE
};

inline constexpr size_t kMaxInput = 64 * 1024;

inline Delivered deliver(const uint8_t* data, size_t size) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) __builtin_trap();
  Delivered d{net::Fd(sv[0]), net::Fd(sv[1])};
  int buffer = 4 * kMaxInput;
  ::setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &buffer, sizeof(buffer));
  ::setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
  ::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &buffer, sizeof(buffer));
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(sv[1], data + done, size - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::shutdown(sv[1], SHUT_WR);
  return d;
}

}  // namespace dtrain::fuzz
