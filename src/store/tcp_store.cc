// TcpStore: one connection to a TcpStoreServer, one request at a time.
//
// Every call is bounded: the server waits for keys at most the call's timeout, and our socket
// I/O gives up kIoMargin after that. A failure in the middle of an exchange leaves the byte
// stream out of step, so the connection is then marked broken and every later call says why.
#include <unistd.h>

#include <algorithm>
#include <mutex>

#include <fmt/format.h>

#include "common/handshake.h"
#include "common/socket.h"
#include "dtrain/store.h"
#include "store/store_protocol.h"
#include "store/store_util.h"

namespace dtrain {

using store::Command;
using store::Request;
using store::Response;
using store::Status;

namespace {

// Time allowed beyond a call's own timeout for the bytes to travel (a 1 GiB value, a busy server).
constexpr std::chrono::milliseconds kIoMargin{10'000};
// Longer timeouts mean "as long as it takes"; clamped so that deadline arithmetic cannot overflow.
constexpr std::chrono::milliseconds kLongestLimit = std::chrono::hours(24 * 365);

std::string who_am_i(int rank) {
  return rank >= 0 ? fmt::format("rank {}", rank) : fmt::format("process {}", ::getpid());
}

}  // namespace

// How long a rank that hosts the store waits, when it is done, for the others to hang up.
constexpr std::chrono::milliseconds kHostLinger{5'000};

struct TcpStore::Impl {
  TcpStoreOptions options;
  std::unique_ptr<TcpStoreServer> server;  // first: destroyed after our connection closed
  net::HostPort address;
  std::string me;     // "rank 3"
  std::string where;  // "rank 3: store 10.0.0.1:29500"
  std::string local_ip;

  std::mutex mutex;  // guards fd and broken, and serialises request/response exchanges on fd
  net::Fd fd;
  std::string broken;  // why the connection is unusable; empty while it is fine

  Response call(const Request& req, std::chrono::milliseconds limit, const std::string& what);
};

Response TcpStore::Impl::call(const Request& req, std::chrono::milliseconds limit,
                              const std::string& what) {
  limit = std::clamp(limit, std::chrono::milliseconds(0), kLongestLimit);
  store::check_limits(req.keys, req.values, fmt::format("{} {}", where, what));
  std::vector<uint8_t> bytes = store::encode_request(req);
  std::lock_guard lock(mutex);
  if (!broken.empty())
    throw StoreError(
        fmt::format("{}: cannot run {}: the connection broke earlier ({}); create a "
                    "new store client",
                    where, what, broken));
  const Deadline wait_deadline = Deadline::after(limit);
  const Deadline io_deadline = Deadline::after(limit + kIoMargin);
  const std::string context = fmt::format("{} {}", where, what);
  Response resp;
  try {
    net::write_all(fd.get(), bytes.data(), bytes.size(), io_deadline, context);
    resp = store::read_response(fd.get(), io_deadline, context);
  } catch (const TimeoutError& e) {
    broken = fmt::format("{} did not answer in time", what);
    throw TimeoutError(fmt::format(
        "{} did not answer {} ({} bytes sent) after {}: {}; check that the store process is alive "
        "and reachable, or raise the timeout",
        where, what, bytes.size(), io_deadline.describe(), e.what()));
  } catch (const Error& e) {
    broken = fmt::format("{} failed: {}", what, e.what());
    throw StoreError(fmt::format(
        "{}: lost the connection during {} ({} bytes to send) after {}: {}; the store process "
        "(the launcher, or rank 0 when it hosts the store) has probably exited: check its log",
        where, what, bytes.size(), io_deadline.describe(), e.what()));
  }
  switch (resp.status) {
    case Status::kOk:
      return resp;
    case Status::kTimeout:
      throw TimeoutError(
          store::missing_keys_message(where, what, req.keys, resp.missing_keys, wait_deadline));
    case Status::kInvalid:
      throw InvalidArgumentError(fmt::format("{}: {}", where, resp.error));
    case Status::kError:
      break;
  }
  throw StoreError(fmt::format("{}: {} failed on the server: {}", where, what, resp.error));
}

TcpStore::TcpStore(const TcpStoreOptions& options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.options = options;
  set_timeout(options.timeout);
  net::HandshakeConfig config = net::HandshakeConfig::from_env();
  if (!options.job_id.empty()) config.job_id = options.job_id;
  if (!options.token.empty()) config.token = options.token;
  s.me = who_am_i(options.rank);
  uint16_t port = options.port;
  if (options.is_server) {
    // Every interface, as c10d does: the host name others use (MASTER_ADDR) may resolve to an
    // address this machine cannot bind (NAT, several interfaces) while still reaching us.
    TcpStoreServerOptions server_options;
    server_options.port = options.port;
    server_options.job_id = config.job_id;
    server_options.token = config.token;
    try {
      s.server = std::make_unique<TcpStoreServer>(server_options);
    } catch (const net::AddressInUseError& e) {
      // Typically workers started by hand against `dtrain store`, or a job still running there.
      throw net::AddressInUseError(fmt::format(
          "{}: cannot host the job's store: {}. If a `dtrain store` (or a launcher) serves that "
          "port, set DTRAIN_AGENT_STORE=1 on every rank so that rank 0 uses it instead of "
          "hosting one; otherwise set MASTER_PORT to a free port",
          s.me, e.what()));
    }
    port = s.server->port();
  }
  s.address = net::HostPort{options.host, port};
  s.where = fmt::format("{}: store {}", s.me, s.address.to_string());

  const Deadline deadline = Deadline::after(options.connect_timeout);
  s.fd = net::connect_tcp(s.address, deadline, s.me + ": connecting to the store");
  net::set_nodelay(s.fd.get());
  net::set_keepalive(s.fd.get(), net::kStoreKeepalive);
  net::Hello hello;
  hello.role = net::Role::kStoreClient;
  hello.rank = options.rank;
  try {
    net::handshake_connect(s.fd.get(), config, hello, -1, deadline, s.where);
  } catch (const TimeoutError&) {
    throw;
  } catch (const Error& e) {
    throw StoreError(fmt::format("{} refused this client: {}", s.where, e.what()));
  }
  s.local_ip = net::local_ip(s.fd.get());
}

TcpStore::~TcpStore() {
  if (!impl_->server) return;
  // Hosting the store: hang up, then give the other ranks a moment to finish with it (a rank
  // still reading the last keys would otherwise fail as if the job had crashed).
  impl_->fd.reset();
  impl_->server->stop(kHostLinger);
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  impl_->call(Request{.command = Command::kSet, .keys = {key}, .values = {value}}, timeout(),
              store::describe_call("set", {key}));
}

Bytes TcpStore::get(const std::string& key) {
  Request req{.command = Command::kGet, .keys = {key}, .timeout = timeout()};
  Response r = impl_->call(req, timeout(), store::describe_call("get", {key}));
  if (r.values.size() != 1)
    throw StoreError(fmt::format("{}: get(\"{}\") answered {} values instead of 1", impl_->where,
                                 key, r.values.size()));
  return std::move(r.values[0]);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  Request req{.command = Command::kAdd, .keys = {key}, .delta = delta};
  return impl_->call(req, timeout(), store::describe_call("add", {key})).integer;
}

Bytes TcpStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  Request req{.command = Command::kCompareSet, .keys = {key}, .values = {expected, desired}};
  Response r = impl_->call(req, timeout(), store::describe_call("compare_set", {key}));
  if (r.values.size() != 1)
    throw StoreError(fmt::format("{}: compare_set(\"{}\") answered {} values instead of 1",
                                 impl_->where, key, r.values.size()));
  return std::move(r.values[0]);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  Request req{.command = Command::kCheck, .keys = keys};
  return impl_->call(req, timeout(), store::describe_call("check", keys)).integer != 0;
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  Request req{.command = Command::kWait, .keys = keys, .timeout = timeout};
  impl_->call(req, timeout, store::describe_call("wait", keys));
}

bool TcpStore::delete_key(const std::string& key) {
  Request req{.command = Command::kDelete, .keys = {key}};
  return impl_->call(req, timeout(), store::describe_call("delete_key", {key})).integer != 0;
}

int64_t TcpStore::num_keys() {
  return impl_->call(Request{.command = Command::kNumKeys}, timeout(), "num_keys()").integer;
}

std::vector<Bytes> TcpStore::multi_get(const std::vector<std::string>& keys) {
  Request req{.command = Command::kMultiGet, .keys = keys, .timeout = timeout()};
  Response r = impl_->call(req, timeout(), store::describe_call("multi_get", keys));
  if (r.values.size() != keys.size())
    throw StoreError(fmt::format("{}: multi_get of {} keys answered {} values", impl_->where,
                                 keys.size(), r.values.size()));
  return std::move(r.values);
}

void TcpStore::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size())
    throw InvalidArgumentError(
        fmt::format("{}: multi_set got {} keys but {} values; pass one value "
                    "per key",
                    impl_->where, keys.size(), values.size()));
  Request req{.command = Command::kMultiSet, .keys = keys, .values = values};
  impl_->call(req, timeout(), store::describe_call("multi_set", keys));
}

const std::string& TcpStore::host() const { return impl_->address.host; }

uint16_t TcpStore::port() const { return impl_->address.port; }

std::string TcpStore::local_ip() const { return impl_->local_ip; }

}  // namespace dtrain
