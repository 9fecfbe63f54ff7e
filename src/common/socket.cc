#include "common/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "common/env.h"
#include "common/log.h"
#include "dtrain/error.h"

namespace dtrain::net {
namespace {

std::string errno_text(int err) { return fmt::format("{} (errno {})", std::strerror(err), err); }

struct AddrInfo {
  addrinfo* head = nullptr;
  ~AddrInfo() {
    if (head) freeaddrinfo(head);
  }
};

// Resolves host:port; returns the getaddrinfo error code (0 on success).
int resolve(const std::string& host, uint16_t port, bool passive, AddrInfo& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  std::string service = std::to_string(port);
  return getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out.head);
}

std::string sockaddr_text(const sockaddr_storage& ss, bool with_port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    port = ntohs(in->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    port = ntohs(in6->sin6_port);
    if (with_port) return fmt::format("[{}]:{}", buf, port);
  } else {
    return "?";
  }
  return with_port ? fmt::format("{}:{}", buf, port) : std::string(buf);
}

}  // namespace

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string HostPort::to_string() const {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

HostPort parse_host_port(std::string_view text, std::string_view what) {
  std::string_view host, port;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':')
      throw InvalidArgumentError(fmt::format("{} '{}' is not [ipv6]:port", what, text));
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos)
      throw InvalidArgumentError(
          fmt::format("{} '{}' has no port: write it as host:port", what, text));
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  int value = 0;
  for (char c : port) {
    if (c < '0' || c > '9' || value > 65535) {
      value = -1;
      break;
    }
    value = value * 10 + (c - '0');
  }
  if (port.empty() || value < 0 || value > 65535)
    throw InvalidArgumentError(fmt::format("{} '{}' has port '{}': use 0-65535", what, text, port));
  if (host.empty()) throw InvalidArgumentError(fmt::format("{} '{}' has no host", what, text));
  return HostPort{std::string(host), static_cast<uint16_t>(value)};
}

bool is_loopback(std::string_view host) {
  return host.starts_with("127.") || host == "::1" || host == "localhost";
}

Fd listen_tcp(const std::string& host, uint16_t port, int backlog) {
  AddrInfo ai;
  std::string bind_host = (host == "0.0.0.0") ? std::string() : host;
  if (int rc = resolve(bind_host, port, true, ai); rc != 0)
    throw InvalidArgumentError(
        fmt::format("cannot listen on {}:{}: {}", host, port, gai_strerror(rc)));
  int last_err = 0;
  // Prefer IPv4 wildcard when no host is given so that 127.0.0.1 clients reach us.
  for (int pass = 0; pass < 2; ++pass) {
    for (addrinfo* a = ai.head; a != nullptr; a = a->ai_next) {
      if (bind_host.empty() && (pass == 0) != (a->ai_family == AF_INET)) continue;
      if (!bind_host.empty() && pass == 1) continue;
      Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (!fd.valid()) {
        last_err = errno;
        continue;
      }
      int one = 1;
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), backlog) != 0) {
        last_err = errno;
        continue;
      }
      return fd;
    }
  }
  const std::string text =
      fmt::format("cannot listen on {}:{}: {}; choose another port or free this one",
                  host.empty() ? "*" : host, port, errno_text(last_err));
  if (last_err == EADDRINUSE) throw AddressInUseError(text);
  throw InvalidArgumentError(text);
}

Fd connect_tcp(const HostPort& to, const Deadline& deadline, std::string_view context) {
  std::string last_error = "no attempt made";
  auto backoff = std::chrono::milliseconds(1);
  // A process that cannot reach its peer (the store not started yet, or never) says so every
  // report interval instead of waiting in silence until its deadline.
  const auto report_every = env::get_seconds(env::kStragglerSeconds);
  auto next_report = Deadline::after(report_every);
  for (;;) {
    if (report_every.count() > 0 && next_report.expired()) {
      next_report = Deadline::after(report_every);
      DTRAIN_LOG_INFO("{}: still trying to reach {} after {} (last error: {})", context,
                      to.to_string(), deadline.describe(), last_error);
    }
    AddrInfo ai;
    if (int rc = resolve(to.host, to.port, false, ai); rc != 0) {
      last_error = fmt::format("cannot resolve host '{}': {}", to.host, gai_strerror(rc));
    } else {
      for (addrinfo* a = ai.head; a != nullptr; a = a->ai_next) {
        Fd fd(
            ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
        if (!fd.valid()) {
          last_error = errno_text(errno);
          continue;
        }
        int rc2 = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
        if (rc2 != 0 && errno == EINPROGRESS) {
          pollfd p{fd.get(), POLLOUT, 0};
          int pr =
              ::poll(&p, 1, std::min(deadline.poll_ms() < 0 ? 1000 : deadline.poll_ms(), 1000));
          if (pr == 1) {
            int err = 0;
            socklen_t len = sizeof(err);
            ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
            rc2 = err == 0 ? 0 : -1;
            errno = err;
          } else {
            rc2 = -1;
            errno = ETIMEDOUT;
          }
        }
        if (rc2 == 0) {
          set_nonblocking(fd.get(), false);
          return fd;
        }
        last_error = errno_text(errno);
      }
    }
    if (deadline.expired())
      throw TimeoutError(fmt::format(
          "{}: could not connect to {} after {} (last error: {}); check that the address is "
          "right and the process there is running",
          context, to.to_string(), deadline.describe(), last_error));
    std::this_thread::sleep_for(std::min(backoff, deadline.remaining()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
}

Fd accept_tcp(int listen_fd, const Deadline& deadline, std::string_view context) {
  for (;;) {
    pollfd p{listen_fd, POLLIN, 0};
    int pr = ::poll(&p, 1, deadline.poll_ms());
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0)
      throw TimeoutError(
          fmt::format("{}: no connection arrived after {}", context, deadline.describe()));
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) return Fd(fd);
    if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
    throw PeerFailureError(fmt::format("{}: accept failed: {}", context, errno_text(errno)));
  }
}

uint16_t local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

std::string local_ip(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return sockaddr_text(ss, false);
}

std::string route_source(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* head = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &head) != 0) return "";
  std::string ip;
  for (addrinfo* a = head; a != nullptr && ip.empty(); a = a->ai_next) {
    Fd fd(::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (fd.get() >= 0 && ::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0)
      ip = local_ip(fd.get());
  }
  freeaddrinfo(head);
  return ip == "?" ? "" : ip;
}

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return sockaddr_text(ss, true);
}

void set_nonblocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void set_buffer_sizes(int fd, int bytes) {
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

bool use_loopback_congestion_control(int fd) {
  static constexpr char kReno[] = "reno";
  return ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, kReno, sizeof(kReno) - 1) == 0;
}

bool peer_is_on_this_host(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0 ||
      local.ss_family != peer.ss_family)
    return false;
  if (peer.ss_family == AF_INET) {
    const auto& l = reinterpret_cast<const sockaddr_in&>(local).sin_addr;
    const auto& p = reinterpret_cast<const sockaddr_in&>(peer).sin_addr;
    return (ntohl(p.s_addr) >> 24) == 127 || l.s_addr == p.s_addr;
  }
  if (peer.ss_family == AF_INET6) {
    const auto& l = reinterpret_cast<const sockaddr_in6&>(local).sin6_addr;
    const auto& p = reinterpret_cast<const sockaddr_in6&>(peer).sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&p) || std::memcmp(&l, &p, sizeof(p)) == 0;
  }
  return false;
}

void set_keepalive(int fd, const Keepalive& k) {
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &k.idle_s, sizeof(k.idle_s));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &k.interval_s, sizeof(k.interval_s));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &k.probes, sizeof(k.probes));
  unsigned int user_timeout_ms = static_cast<unsigned>(k.limit_s() * 1000);
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
}

namespace {

// Waits until fd is ready for `events`; false when the deadline passed.
bool wait_ready(int fd, short events, const Deadline& deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int pr = ::poll(&p, 1, deadline.poll_ms());
    if (pr > 0) return true;
    if (pr == 0) return false;
    if (errno != EINTR) return true;  // let the next read/write report the error
  }
}

}  // namespace

void write_all(int fd, const void* data, size_t size, const Deadline& deadline,
               std::string_view context) {
  auto* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::send(fd, p + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_ready(fd, POLLOUT, deadline))
        throw TimeoutError(fmt::format("{}: sending stalled at {} of {} bytes after {}", context,
                                       done, size, deadline.describe()));
      continue;
    }
    throw PeerFailureError(
        fmt::format("{}: connection lost while sending ({} of {} bytes sent): {}", context, done,
                    size, errno_text(errno)));
  }
}

void read_all(int fd, void* data, size_t size, const Deadline& deadline, std::string_view context) {
  auto* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::recv(fd, p + done, size - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0)
      throw PeerFailureError(
          fmt::format("{}: connection closed by the other side ({} of {} bytes received)", context,
                      done, size));
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_ready(fd, POLLIN, deadline))
        throw TimeoutError(fmt::format("{}: nothing arrived for {} ({} of {} bytes received)",
                                       context, deadline.describe(), done, size));
      continue;
    }
    throw PeerFailureError(fmt::format("{}: connection lost while receiving ({} of {} bytes): {}",
                                       context, done, size, errno_text(errno)));
  }
}

}  // namespace dtrain::net
