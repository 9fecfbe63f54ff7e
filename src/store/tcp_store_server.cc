// TcpStoreServer: the key-value map, one acceptor thread, and one thread per client.
//
// Thread per client keeps the code plain (a blocking read, a blocking wait on the condition
// variable) and is cheap at the scale of a rendezvous (one connection per rank, a few thousand
// at most). The acceptor does no I/O with clients: each client's thread runs its handshake, so a
// slow or hostile peer only ever holds up its own thread. A thread whose client left is joined
// by the acceptor at the next accept, so connections that come and go do not pile up threads.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "common/handshake.h"
#include "common/handshake_room.h"
#include "common/log.h"
#include "common/socket.h"
#include "dtrain/store.h"
#include "store/store_protocol.h"
#include "store/store_util.h"
#include "store/torch_store_protocol.h"

namespace dtrain {

using store::Command;
using store::Request;
using store::Response;
using store::Status;

namespace {

// A client has this long to deliver the rest of a request once its first byte arrived; generous
// because a request may carry up to 1 GiB, but bounded so that a stalled client frees its thread.
constexpr std::chrono::milliseconds kRequestBodyTimeout{300'000};
// And this long to take our response off the socket.
constexpr std::chrono::milliseconds kResponseTimeout{300'000};

struct Connection {
  net::Fd fd;  // written (closed) only under connections_mutex
  std::string peer;
  std::string source;                // the peer's host
  std::atomic<bool> unproven{true};  // has not passed the handshake (or spoken torch's protocol)
  std::atomic<bool> spoke{false};    // sent something (a real client sends its hello at once)
  std::atomic<bool> finished{false};
  std::jthread thread;  // last: destroyed (joined) before fd closes
};

// Still in its handshake (or silent), and not closed: counted against max_unproven.
bool open_unproven(const Connection& c) { return !c.finished && c.unproven && c.fd.valid(); }

}  // namespace

struct TcpStoreServer::Impl {
  TcpStoreServerOptions options;
  net::HandshakeConfig handshake;
  net::Fd listener;
  net::Fd wake;  // eventfd: written once by stop() to end the acceptor's poll
  uint16_t port = 0;

  std::mutex data_mutex;                 // guards data and stopping
  std::condition_variable data_changed;  // notified on every write, and on stop
  std::unordered_map<std::string, Bytes> data;
  bool stopping = false;

  std::mutex connections_mutex;  // guards connections and each Connection's fd
  std::list<std::unique_ptr<Connection>> connections;

  std::once_flag stop_once;
  std::jthread acceptor;  // last: joined first when Impl is destroyed without stop()

  void accept_loop();
  void make_room_for(const std::string& source);
  // Connections that may be silent or in their handshake at once (make_room_for).
  size_t max_unproven = 512;
  void serve(Connection& c);
  bool first_byte(Connection& c, uint8_t& byte);
  void serve_torch(Connection& c);
  Response handle(const Request& req);
  Response append(const std::string& key, const Bytes& suffix);
  Response wait_for_count(const std::string& key, int64_t at_least,
                          std::chrono::milliseconds timeout);
  bool all_present(const std::vector<std::string>& keys) const;
  std::vector<std::string> missing(const std::vector<std::string>& keys) const;
  void reap_finished();
  void stop(std::chrono::milliseconds wait_for_clients);
};

bool TcpStoreServer::Impl::all_present(const std::vector<std::string>& keys) const {
  for (const auto& k : keys)
    if (!data.contains(k)) return false;
  return true;
}

std::vector<std::string> TcpStoreServer::Impl::missing(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  for (const auto& k : keys)
    if (!data.contains(k)) out.push_back(k);
  return out;
}

namespace {

// The shapes each command must have; anything else is a broken or hostile client.
std::string shape_error(const Request& req) {
  size_t k = req.keys.size(), v = req.values.size();
  bool ok = true;
  switch (req.command) {
    case Command::kSet:
      ok = k == 1 && v == 1;
      break;
    case Command::kGet:
    case Command::kAdd:
    case Command::kDelete:
      ok = k == 1 && v == 0;
      break;
    case Command::kCompareSet:
      ok = k == 1 && v == 2;
      break;
    case Command::kCheck:
    case Command::kWait:
    case Command::kMultiGet:
      ok = v == 0;
      break;
    case Command::kNumKeys:
      ok = k == 0 && v == 0;
      break;
    case Command::kMultiSet:
      ok = k == v;
      break;
  }
  if (ok) return "";
  return fmt::format("malformed {} request: {} keys and {} values",
                     store::command_name(req.command), k, v);
}

}  // namespace

Response TcpStoreServer::Impl::handle(const Request& req) {
  Response resp;
  if (std::string err = shape_error(req); !err.empty()) {
    resp.status = Status::kError;
    resp.error = err;
    return resp;
  }
  std::unique_lock lock(data_mutex);
  // Waits for keys up to the request's timeout; false (with resp filled in) when they never came.
  auto wait_for = [&](const std::vector<std::string>& keys) {
    bool arrived =
        data_changed.wait_for(lock, req.timeout, [&] { return stopping || all_present(keys); });
    if (stopping) {
      resp.status = Status::kError;
      resp.error = "the store server is shutting down";
      return false;
    }
    if (!arrived) {
      resp.status = Status::kTimeout;
      resp.missing_keys = missing(keys);
      return false;
    }
    return true;
  };
  switch (req.command) {
    case Command::kSet:
      data[req.keys[0]] = req.values[0];
      data_changed.notify_all();
      break;
    case Command::kGet:
    case Command::kMultiGet:
      if (!wait_for(req.keys)) break;
      for (const auto& k : req.keys) resp.values.push_back(data.at(k));
      break;
    case Command::kWait:
      wait_for(req.keys);
      break;
    case Command::kAdd: {
      auto it = data.find(req.keys[0]);
      try {
        resp.integer =
            store::add_to_value(it == data.end() ? nullptr : &it->second, req.delta, req.keys[0]);
      } catch (const InvalidArgumentError& e) {
        resp.status = Status::kInvalid;
        resp.error = e.what();
        break;
      }
      data[req.keys[0]] = store::integer_value(resp.integer);
      data_changed.notify_all();
      break;
    }
    case Command::kCompareSet: {
      bool changed = false;
      resp.values.push_back(
          store::compare_set_in(data, req.keys[0], req.values[0], req.values[1], changed));
      if (changed) data_changed.notify_all();
      break;
    }
    case Command::kCheck:
      resp.integer = all_present(req.keys) ? 1 : 0;
      break;
    case Command::kDelete:
      resp.integer = data.erase(req.keys[0]) > 0 ? 1 : 0;
      break;
    case Command::kNumKeys:
      resp.integer = static_cast<int64_t>(data.size());
      break;
    case Command::kMultiSet:
      for (size_t i = 0; i < req.keys.size(); ++i) data[req.keys[i]] = req.values[i];
      data_changed.notify_all();
      break;
  }
  return resp;
}

// torch 2.x's APPEND: dtrain's own protocol has no such command, so torch's clients reach it here.
Response TcpStoreServer::Impl::append(const std::string& key, const Bytes& suffix) {
  Response resp;
  std::lock_guard lock(data_mutex);
  auto it = data.find(key);
  const size_t current = it == data.end() ? 0 : it->second.size();
  if (current + suffix.size() > store::kMaxValueBytes) {
    resp.status = Status::kInvalid;
    resp.error = fmt::format(
        "appending {} bytes to key '{}' ({} bytes) would go over the value limit of {} bytes",
        suffix.size(), key, current, store::kMaxValueBytes);
    return resp;
  }
  if (it == data.end()) it = data.emplace(key, Bytes{}).first;
  it->second.insert(it->second.end(), suffix.begin(), suffix.end());
  data_changed.notify_all();
  return resp;
}

// torch 2.x's BARRIER: waits for a counter (decimal text, as add writes it) to reach a number.
Response TcpStoreServer::Impl::wait_for_count(const std::string& key, int64_t at_least,
                                              std::chrono::milliseconds timeout) {
  Response resp;
  std::unique_lock lock(data_mutex);
  auto reached = [&] {
    auto it = data.find(key);
    return store::add_to_value(it == data.end() ? nullptr : &it->second, 0, key) >= at_least;
  };
  try {
    if (data_changed.wait_for(lock, timeout, [&] { return stopping || reached(); }) && !stopping)
      return resp;
  } catch (const InvalidArgumentError& e) {
    resp.status = Status::kInvalid;
    resp.error = e.what();
    return resp;
  }
  resp.status = stopping ? Status::kError : Status::kTimeout;
  if (stopping) resp.error = "the store server is shutting down";
  return resp;
}

// Waits for the client's first byte and peeks at it; false when the client hung up (or the
// server stopped) first. With torch clients served, a connection that stays silent is held:
// torch 1.13's client opens one (for watch_key callbacks) that never speaks unless asked to.
bool TcpStoreServer::Impl::first_byte(Connection& c, uint8_t& byte) {
  const int fd = c.fd.get();
  const Deadline deadline =
      options.torch_clients ? Deadline::never() : Deadline::after(options.handshake_timeout);
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    int pr = ::poll(&p, 1, deadline.poll_ms());
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0) {
      DTRAIN_LOG_WARN("store server: {} sent nothing within {} ms; closing the connection", c.peer,
                      options.handshake_timeout.count());
      return false;
    }
    ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK);
    if (n == 1) {
      c.spoke = true;
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    return false;  // hung up, or shut down by stop()
  }
}

void TcpStoreServer::Impl::serve(Connection& c) {
  const int fd = c.fd.get();
  uint8_t first = 0;
  if (!first_byte(c, first)) return;
  if (options.torch_clients && store::is_torch_query(first)) {
    c.unproven = false;
    serve_torch(c);
    return;
  }
  try {
    net::handshake_accept(fd, handshake, net::Role::kStoreClient, -1,
                          Deadline::after(options.handshake_timeout));
    c.unproven = false;
  } catch (const net::HandshakeRefused& r) {
    DTRAIN_LOG_WARN("store server: refused a connection: {}", r.reason);
    return;
  } catch (const std::exception& e) {
    DTRAIN_LOG_WARN("store server: handshake with {} failed: {}", c.peer, e.what());
    return;
  }
  const std::string context = fmt::format("store server, client {}", c.peer);
  try {
    for (;;) {
      std::optional<Request> req = store::read_request(fd, kRequestBodyTimeout, context);
      if (!req) break;  // the client closed its connection (or stop() shut it)
      Response resp = handle(*req);
      std::vector<uint8_t> out = store::encode_response(resp);
      net::write_all(fd, out.data(), out.size(), Deadline::after(kResponseTimeout), context);
    }
  } catch (const std::exception& e) {
    bool stopping_now;
    {
      std::lock_guard lock(data_mutex);
      stopping_now = stopping;
    }
    // Errors caused by stop() shutting the socket are expected; anything else is worth a line.
    if (!stopping_now) DTRAIN_LOG_WARN("store server: dropped client {}: {}", c.peer, e.what());
  }
}

void TcpStoreServer::Impl::serve_torch(Connection& c) {
  if (!handshake.token.empty()) {
    DTRAIN_LOG_WARN(
        "store server: refused a torch TCPStore client from {}: the job has an "
        "authentication token (DTRAIN_AUTH_TOKEN), which torch's store protocol "
        "cannot present",
        c.peer);
    return;
  }
  const std::string context = fmt::format("store server, torch client {}", c.peer);
  try {
    store::TorchClientHooks hooks;
    hooks.handle = [this](const Request& r) { return handle(r); };
    hooks.append = [this](const std::string& key, const Bytes& suffix) {
      return append(key, suffix);
    };
    hooks.wait_for_count = [this](const std::string& key, int64_t at_least,
                                  std::chrono::milliseconds timeout) {
      return wait_for_count(key, at_least, timeout);
    };
    store::serve_torch_client(c.fd.get(), hooks, context);
  } catch (const std::exception& e) {
    bool stopping_now;
    {
      std::lock_guard lock(data_mutex);
      stopping_now = stopping;
    }
    if (!stopping_now)
      DTRAIN_LOG_WARN("store server: dropped torch client {}: {}", c.peer, e.what());
  }
}

void TcpStoreServer::Impl::reap_finished() {
  std::list<std::unique_ptr<Connection>> done;
  {
    std::lock_guard lock(connections_mutex);
    for (auto it = connections.begin(); it != connections.end();) {
      auto next = std::next(it);
      if ((*it)->finished.load()) done.splice(done.end(), connections, it);
      it = next;
    }
  }
  // Joined outside the lock; their threads have returned already.
}

// At most max_unproven connections may be silent or in their handshake: beyond that, one is
// closed (net::handshake_to_close: the oldest silent one), from the newcomer's host if it has
// any there, else from anywhere. Silent sockets then hold a bounded share of the descriptors,
// and a real client, whose handshake takes a millisecond, gets in. (With torch clients served,
// a silent connection is held without a limit of time, so this is their only bound.)
// connections_mutex held.
void TcpStoreServer::Impl::make_room_for(const std::string& source) {
  size_t unproven = 0;
  for (auto& c : connections) unproven += open_unproven(*c) ? 1 : 0;
  if (unproven < max_unproven) return;
  Connection* victim = net::handshake_to_close(
      connections, [&](const Connection& c) { return open_unproven(c) && c.source == source; });
  if (victim == nullptr) victim = net::handshake_to_close(connections, open_unproven);
  const bool silent = !victim->spoke && !net::input_waiting(victim->fd.get());
  DTRAIN_LOG_WARN(
      "store server: closed the connection from {}, which has not completed a "
      "handshake{}, to make room: at most {} connections may be silent or in their "
      "handshake (a quarter of this process's file descriptors, at most 512)",
      victim->peer, silent ? " and sent nothing" : "", max_unproven);
  victim->unproven = false;  // counted out now; its thread ends and closes it
  ::shutdown(victim->fd.get(), SHUT_RDWR);
}

void TcpStoreServer::Impl::accept_loop() {
  for (;;) {
    pollfd fds[2] = {{listener.get(), POLLIN, 0}, {wake.get(), POLLIN, 0}};
    int pr = ::poll(fds, 2, -1);
    if (pr < 0) {
      if (errno == EINTR) continue;
      DTRAIN_LOG_ERROR("store server: poll on the listening socket failed: {}",
                       std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;  // stop()
    int raw = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (raw < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED)
        continue;
      DTRAIN_LOG_WARN("store server: accept failed: {}; retrying", std::strerror(errno));
      // Out of file descriptors and the like: back off instead of spinning on poll.
      pollfd w{wake.get(), POLLIN, 0};
      ::poll(&w, 1, 100);
      continue;
    }
    reap_finished();
    auto conn = std::make_unique<Connection>();
    conn->fd = net::Fd(raw);
    conn->peer = net::peer_name(raw);
    conn->source = conn->peer.substr(0, conn->peer.rfind(':'));
    net::set_nodelay(raw);
    net::set_keepalive(raw, net::kStoreKeepalive);
    Connection& c = *conn;
    std::lock_guard lock(connections_mutex);
    make_room_for(c.source);
    connections.push_back(std::move(conn));
    c.thread = std::jthread([this, &c] {
      serve(c);
      // Closed now, not at reaping, so that a refused or departed peer sees EOF at once. Under
      // the lock, so that stop() never shuts down a number the kernel has handed out again.
      std::lock_guard lock(connections_mutex);
      c.fd.reset();
      c.finished.store(true);
    });
  }
}

void TcpStoreServer::Impl::stop(std::chrono::milliseconds wait_for_clients) {
  const Deadline linger = Deadline::after(wait_for_clients);
  for (size_t logged = 0;;) {
    size_t open = 0;
    {
      std::lock_guard lock(connections_mutex);
      for (auto& c : connections) open += c->finished.load() ? 0 : 1;
    }
    if (open == 0 || linger.expired()) break;
    if (logged != open)
      DTRAIN_LOG_DEBUG("store server: waiting up to {} for {} client(s) to hang up",
                       linger.describe(), open);
    logged = open;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::call_once(stop_once, [this] {
    {
      std::lock_guard lock(data_mutex);
      stopping = true;
    }
    data_changed.notify_all();
    uint64_t one = 1;
    if (::write(wake.get(), &one, sizeof(one)) != sizeof(one))
      DTRAIN_LOG_ERROR("store server: cannot wake the acceptor: {}", std::strerror(errno));
    if (acceptor.joinable()) acceptor.join();
    listener.reset();
    std::list<std::unique_ptr<Connection>> all;
    {
      std::lock_guard lock(connections_mutex);
      // Wakes each client thread out of its read (or write); the fd is closed once it is joined.
      for (auto& c : connections)
        if (c->fd.valid()) ::shutdown(c->fd.get(), SHUT_RDWR);
      all.swap(connections);
    }
    all.clear();  // joins every client thread
    DTRAIN_LOG_DEBUG("store server on port {} stopped", port);
  });
}

TcpStoreServer::TcpStoreServer(const TcpStoreServerOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  impl_->handshake = net::HandshakeConfig::from_env();
  if (!options.job_id.empty()) impl_->handshake.job_id = options.job_id;
  if (!options.token.empty()) impl_->handshake.token = options.token;
  impl_->listener = net::listen_tcp(options.host, options.port);
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY)
    impl_->max_unproven =
        std::clamp<size_t>(static_cast<size_t>(files.rlim_cur) / 4, 16, impl_->max_unproven);
  net::set_nonblocking(impl_->listener.get(), true);
  impl_->port = net::local_port(impl_->listener.get());
  impl_->wake = net::Fd(::eventfd(0, EFD_CLOEXEC));
  if (!impl_->wake.valid())
    throw StoreError(
        fmt::format("store server: cannot create an eventfd: {}", std::strerror(errno)));
  impl_->acceptor = std::jthread([impl = impl_.get()] { impl->accept_loop(); });
  DTRAIN_LOG_DEBUG("store server: listening on {}:{} (job '{}', authentication {})",
                   options.host.empty() ? "*" : options.host, impl_->port, impl_->handshake.job_id,
                   impl_->handshake.token.empty() ? "off" : "on");
}

TcpStoreServer::~TcpStoreServer() { stop(); }

uint16_t TcpStoreServer::port() const { return impl_->port; }

void TcpStoreServer::stop(std::chrono::milliseconds wait_for_clients) {
  impl_->stop(wait_for_clients);
}

}  // namespace dtrain
