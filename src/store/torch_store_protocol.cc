#include "store/torch_store_protocol.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/log.h"
#include "common/socket.h"

namespace dtrain::store {
namespace {

enum class Query : uint8_t {
  kSet = 0,
  kCompareSet = 1,
  kGet = 2,
  kAdd = 3,
  kCheck = 4,
  kWait = 5,
  kNumKeys = 6,
  kWatchKey = 7,
  kDeleteKey = 8,
};

// A request's body must arrive within this once its first byte has (the client writes it in
// pieces, without pausing); the first byte itself may take as long as the client likes.
constexpr std::chrono::milliseconds kBodyTimeout{300'000};
constexpr std::chrono::milliseconds kReplyTimeout{300'000};
// A WAIT is served in slices this long, to notice a client that gave up and left.
constexpr std::chrono::milliseconds kWaitSlice{500};

class Connection {
 public:
  Connection(int fd, std::string_view context) : fd_(fd), context_(context) {}

  // False when the client closed the connection between requests.
  bool read_query(Query& q) {
    uint8_t b;
    for (;;) {
      ssize_t n = ::recv(fd_, &b, 1, 0);
      if (n == 1) break;
      if (n == 0) return false;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        net::read_all(fd_, &b, 1, Deadline::never(), context_);
        break;
      }
      throw PeerFailureError(
          fmt::format("{}: reading a request failed: {}", context_, std::strerror(errno)));
    }
    if (b > static_cast<uint8_t>(Query::kDeleteKey))
      throw ProtocolError(fmt::format("{}: unknown torch store query {}", context_, b));
    q = static_cast<Query>(b);
    return true;
  }
  uint64_t u64() {
    uint64_t v;
    net::read_all(fd_, &v, sizeof(v), Deadline::after(kBodyTimeout), context_);
    return v;
  }
  Bytes blob(uint64_t limit, std::string_view what) {
    uint64_t size = u64();
    if (size > limit)
      throw ProtocolError(
          fmt::format("{}: a {} of {} bytes is over the limit of {}", context_, what, size, limit));
    Bytes b(size);
    if (size > 0) net::read_all(fd_, b.data(), size, Deadline::after(kBodyTimeout), context_);
    return b;
  }
  std::string key() {
    Bytes b = blob(kMaxKeyBytes, "key");
    return std::string(b.begin(), b.end());
  }
  std::vector<std::string> keys() {
    uint64_t count = u64();
    if (count > kMaxItems)
      throw ProtocolError(fmt::format("{}: {} keys in one request is over the limit of {}",
                                      context_, count, kMaxItems));
    std::vector<std::string> out;
    out.reserve(count);
    for (uint64_t i = 0; i < count; ++i) out.push_back(key());
    return out;
  }
  void reply(const void* data, size_t size) {
    net::write_all(fd_, data, size, Deadline::after(kReplyTimeout), context_);
  }
  void reply_u8(uint8_t v) { reply(&v, 1); }
  void reply_i64(int64_t v) { reply(&v, sizeof(v)); }
  void reply_bytes(const Bytes& b) {
    uint64_t size = b.size();
    std::vector<uint8_t> out(sizeof(size) + b.size());
    std::memcpy(out.data(), &size, sizeof(size));
    if (!b.empty()) std::memcpy(out.data() + sizeof(size), b.data(), b.size());
    reply(out.data(), out.size());
  }
  // The client gave up (its own timeout) and closed the connection while we waited for keys.
  bool client_left() {
    uint8_t b;
    ssize_t n = ::recv(fd_, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  const std::string& context() const { return context_; }

 private:
  int fd_;
  std::string context_;
};

// kError from handle: the server is stopping. kInvalid: a request that makes no sense (ADD to
// a value that is not a number), which torch's server answers by closing the connection.
bool ok(const Response& r, const Connection& c) {
  if (r.status == Status::kOk) return true;
  if (r.status == Status::kInvalid)
    DTRAIN_LOG_WARN("{}: closing the connection: {}", c.context(), r.error);
  return false;
}

// The value an answer must carry; a store that answered without one broke its own contract.
const Bytes& first_value(const Response& r, std::string_view what, std::string_view context) {
  if (r.values.empty())
    throw InternalError(fmt::format("{}: the store answered {} without a value", context, what));
  return r.values.front();
}

}  // namespace

void serve_torch_client(int fd, const TorchClientHooks& hooks, std::string_view context) {
  Connection c(fd, context);
  for (Query q; c.read_query(q);) {
    Request req;
    switch (q) {
      case Query::kSet: {
        req.command = Command::kSet;
        req.keys = {c.key()};
        req.values = {c.blob(kMaxValueBytes, "value")};
        if (!ok(hooks.handle(req), c)) return;
        break;
      }
      case Query::kCompareSet: {
        req.command = Command::kCompareSet;
        req.keys = {c.key()};
        Bytes expected = c.blob(kMaxValueBytes, "value"), desired = c.blob(kMaxValueBytes, "value");
        req.values = {expected, desired};
        Response r = hooks.handle(req);
        if (!ok(r, c)) return;
        // torch answers a missing key with `expected` when that is not empty; dtrain with empty.
        Bytes out = first_value(r, "compare_set", context);
        if (out.empty() && !expected.empty()) out = expected;
        c.reply_bytes(out);
        break;
      }
      case Query::kGet: {
        req.command = Command::kGet;
        req.keys = {c.key()};
        Response r = hooks.handle(req);  // timeout 0: torch's client has waited for the key
        if (r.status == Status::kTimeout) {
          DTRAIN_LOG_WARN("{}: GET of missing key '{}': closing the connection, as torch does",
                          context, req.keys[0]);
          return;
        }
        if (!ok(r, c)) return;
        c.reply_bytes(first_value(r, "get", context));
        break;
      }
      case Query::kAdd: {
        req.command = Command::kAdd;
        req.keys = {c.key()};
        req.delta = static_cast<int64_t>(c.u64());
        Response r = hooks.handle(req);
        if (!ok(r, c)) return;
        c.reply_i64(r.integer);
        break;
      }
      case Query::kCheck: {
        req.command = Command::kCheck;
        req.keys = c.keys();
        Response r = hooks.handle(req);
        if (!ok(r, c)) return;
        c.reply_u8(r.integer == 1 ? 0 : 1);
        break;
      }
      case Query::kWait: {
        req.command = Command::kWait;
        req.keys = c.keys();
        req.timeout = kWaitSlice;
        for (;;) {
          Response r = hooks.handle(req);
          if (r.status == Status::kOk) break;
          if (r.status != Status::kTimeout || c.client_left()) return;
        }
        c.reply_u8(0);  // STOP_WAITING
        break;
      }
      case Query::kNumKeys: {
        req.command = Command::kNumKeys;
        Response r = hooks.handle(req);
        if (!ok(r, c)) return;
        c.reply_i64(r.integer);
        break;
      }
      case Query::kDeleteKey: {
        req.command = Command::kDelete;
        req.keys = {c.key()};
        Response r = hooks.handle(req);
        if (!ok(r, c)) return;
        c.reply_i64(r.integer);
        break;
      }
      case Query::kWatchKey: {
        const std::string key = c.key();
        DTRAIN_LOG_WARN(
            "{}: torch's watch_key ('{}') is not served by dtrain's store; closing "
            "the connection",
            context, key);
        return;
      }
    }
  }
}

}  // namespace dtrain::store
