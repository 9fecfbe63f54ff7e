// Sockets: an RAII file descriptor, address parsing, listening, connecting with retry, and
// whole-buffer reads and writes bounded by a deadline. Errors carry the caller's context string
// (who is talking to whom, about what) so that every message names both ends.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "common/deadline.h"
#include "dtrain/error.h"

namespace dtrain::net {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string to_string() const;
};
// Parses "host:port", "[v6]:port"; throws InvalidArgumentError naming `what` on bad input.
HostPort parse_host_port(std::string_view text, std::string_view what);

// Listens on host:port (host "" or "0.0.0.0" = every interface, port 0 = any free port).
// Another process listens on the port already (EADDRINUSE): callers that know who that may be
// say what to do about it.
class AddressInUseError : public InvalidArgumentError {
 public:
  using InvalidArgumentError::InvalidArgumentError;
};

// Whether `host` is a loopback address (127.0.0.0/8, ::1) or "localhost".
bool is_loopback(std::string_view host);

// Throws AddressInUseError when the port is taken, InvalidArgumentError for other failures.
Fd listen_tcp(const std::string& host, uint16_t port, int backlog = 1024);
// Connects to host:port, retrying refused or unreachable attempts until the deadline.
// Throws TimeoutError (with `context` and the last errno) when the deadline passes.
Fd connect_tcp(const HostPort& to, const Deadline& deadline, std::string_view context);
// Accepts one connection, waiting at most until the deadline (TimeoutError otherwise).
Fd accept_tcp(int listen_fd, const Deadline& deadline, std::string_view context);

uint16_t local_port(int fd);
std::string local_ip(int fd);  // "127.0.0.1"
// The address of this host's interface that routes to `host` (a UDP socket connected to it:
// nothing is sent); "" when `host` does not resolve or no route leads there.
std::string route_source(const std::string& host);
std::string peer_name(int fd);  // "127.0.0.1:41234"

void set_nonblocking(int fd, bool on);
void set_nodelay(int fd);
void set_buffer_sizes(int fd, int bytes);
// Over loopback there is no link to share: congestion control only adds work, and BBR (the
// default of many hosts) paces even there, holding back every burst a collective makes. Switches
// the connection to Reno, which every kernel has and lets any user pick, and does not pace.
// False (the host's choice stays) when the kernel refuses.
bool use_loopback_congestion_control(int fd);
// Whether the other end of a connected TCP socket is on this host: a loopback address, or the
// address this end has.
bool peer_is_on_this_host(int fd);
// TCP keepalive: after `idle_s` silent seconds, `probes` probes `interval_s` apart; the same
// bound (TCP_USER_TIMEOUT) for a connection whose data goes unacknowledged.
struct Keepalive {
  int idle_s;
  int interval_s;
  int probes;
  constexpr int limit_s() const { return idle_s + interval_s * probes; }
};
// Between a job's processes (the transport's pairs, parameter-server links): a silent peer (host
// gone, cable cut) is noticed within 7 s. Five probes, not three: on a lossy link (2% each way)
// three lost in a row, and with them an idle connection of a healthy job, came once in a few
// runs of a test with a 400 ms blackout.
inline constexpr Keepalive kPeerKeepalive{.idle_s = 2, .interval_s = 1, .probes = 5};
// To and from the store, idle for most of a job: a dead store host is noticed within 45 s.
inline constexpr Keepalive kStoreKeepalive{.idle_s = 30, .interval_s = 5, .probes = 3};
void set_keepalive(int fd, const Keepalive& k);

// Whole-buffer I/O on a blocking or non-blocking socket; waits with poll(2) up to the deadline.
// A closed connection or socket error throws PeerFailureError, the deadline TimeoutError; both
// messages start with `context` and say how many bytes of how many moved.
void write_all(int fd, const void* data, size_t size, const Deadline& deadline,
               std::string_view context);
void read_all(int fd, void* data, size_t size, const Deadline& deadline, std::string_view context);

}  // namespace dtrain::net
