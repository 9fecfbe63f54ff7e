#include "store/torch_store_protocol.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "common/log.h"
#include "common/socket.h"
#include "store/store_util.h"

namespace dtrain::store {
namespace {

// torch 1.13's queries.
enum class Query1 : uint8_t {
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

std::string_view query_name(Query1 q) {
  static constexpr std::string_view kNames[] = {
      "SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS", "WATCH_KEY", "DELETE_KEY"};
  const auto i = static_cast<size_t>(q);
  return i < std::size(kNames) ? kNames[i] : "unknown query";
}

// torch 2.x's queries (TCPStoreBackend.hpp's QueryType).
enum class Query2 : uint8_t {
  kValidate = 0,
  kSet = 1,
  kCompareSet = 2,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kNumKeys = 7,
  kDeleteKey = 8,
  kAppend = 9,
  kMultiGet = 10,
  kMultiSet = 11,
  kCancelWait = 12,
  kPing = 13,
  kQueuePush = 14,
  kQueuePop = 15,
  kQueueLen = 16,
  kListKeys = 17,
  kBarrier = 18,
};

std::string_view query_name(Query2 q) {
  static constexpr std::string_view kNames[] = {
      "VALIDATE",   "SET",        "COMPARE_SET", "GET",       "ADD",       "CHECK",       "WAIT",
      "GETNUMKEYS", "DELETE_KEY", "APPEND",      "MULTI_GET", "MULTI_SET", "CANCEL_WAIT", "PING",
      "QUEUE_PUSH", "QUEUE_POP",  "QUEUE_LEN",   "LIST_KEYS", "BARRIER"};
  const auto i = static_cast<size_t>(q);
  return i < std::size(kNames) ? kNames[i] : "unknown query";
}

// torch's WaitResponseType.
constexpr uint8_t kStopWaiting = 0;
constexpr uint8_t kWaitCanceled = 1;

// A request's body must arrive within this once its first byte has (the client writes it in
// pieces, without pausing); the first byte itself may take as long as the client likes.
constexpr std::chrono::milliseconds kBodyTimeout{300'000};
constexpr std::chrono::milliseconds kReplyTimeout{300'000};
// A wait is served in slices this long, to notice a client that left or (2.x) sent CANCEL_WAIT:
// a 2.x client's timed-out wait is answered within this of its cancel.
constexpr std::chrono::milliseconds kWaitSlice{100};

class Connection {
 public:
  Connection(int fd, std::string_view context) : fd_(fd), context_(context) {}

  // The next query's byte, without a time limit; false when the client closed the connection
  // between requests.
  bool read_query(uint8_t& b) {
    for (;;) {
      ssize_t n = ::recv(fd_, &b, 1, 0);
      if (n == 1) return true;
      if (n == 0) return false;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        net::read_all(fd_, &b, 1, Deadline::never(), context_);
        return true;
      }
      throw PeerFailureError(
          fmt::format("{}: reading a request failed: {}", context_, std::strerror(errno)));
    }
  }
  // Peeks at the connection's first `size` bytes, waiting for them up to kBodyTimeout; false
  // when the client hung up before sending them.
  bool peek(uint8_t* out, size_t size) {
    const Deadline deadline = Deadline::after(kBodyTimeout);
    for (;;) {
      ssize_t n = ::recv(fd_, out, size, MSG_PEEK | MSG_DONTWAIT);
      if (n == static_cast<ssize_t>(size)) return true;
      if (n == 0) return false;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        throw PeerFailureError(fmt::format("{}: reading the first request failed: {}", context_,
                                           std::strerror(errno)));
      if (deadline.expired())
        throw TimeoutError(fmt::format(
            "{}: the first {} bytes of the connection did not arrive within {} ms (got {})",
            context_, size, kBodyTimeout.count(), n < 0 ? 0 : n));
      if (n > 0) {
        // Some bytes are there but not all: the rest follow from the same write, so a short nap,
        // unless the client already hung up (then no more will come).
        pollfd p{fd_, POLLRDHUP, 0};
        if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP)) != 0) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      } else {
        pollfd p{fd_, POLLIN, 0};
        ::poll(&p, 1, deadline.poll_ms());
      }
    }
  }
  template <typename T>
  T value() {
    T v;
    net::read_all(fd_, &v, sizeof(v), Deadline::after(kBodyTimeout), context_);
    return v;
  }
  uint64_t u64() { return value<uint64_t>(); }
  Bytes blob(uint64_t limit, std::string_view what) {
    uint64_t size = u64();
    if (size > limit)
      throw ProtocolError(fmt::format("{}: {}: a {} of {} bytes is over the limit of {}", context_,
                                      query_, what, size, limit));
    Bytes b(size);
    if (size > 0) net::read_all(fd_, b.data(), size, Deadline::after(kBodyTimeout), context_);
    return b;
  }
  std::string key() {
    Bytes b = blob(kMaxKeyBytes, "key");
    return std::string(b.begin(), b.end());
  }
  uint64_t count(std::string_view what) {
    uint64_t n = u64();
    if (n > kMaxItems)
      throw ProtocolError(fmt::format("{}: {}: {} {} in one request is over the limit of {}",
                                      context_, query_, n, what, kMaxItems));
    return n;
  }
  std::vector<std::string> keys() {
    uint64_t n = count("keys");
    std::vector<std::string> out;
    out.reserve(n);
    for (uint64_t i = 0; i < n; ++i) out.push_back(key());
    return out;
  }
  void reply(const void* data, size_t size) {
    net::write_all(fd_, data, size, Deadline::after(kReplyTimeout), context_);
  }
  void reply_u8(uint8_t v) { reply(&v, 1); }
  void reply_u32(uint32_t v) { reply(&v, sizeof(v)); }
  void reply_i64(int64_t v) { reply(&v, sizeof(v)); }
  void reply_bytes(const std::vector<Bytes>& values) {
    size_t total = 0;
    for (const Bytes& b : values) total += sizeof(uint64_t) + b.size();
    std::vector<uint8_t> out(total);
    uint8_t* p = out.data();
    for (const Bytes& b : values) {
      uint64_t size = b.size();
      std::memcpy(p, &size, sizeof(size));
      if (!b.empty()) std::memcpy(p + sizeof(size), b.data(), b.size());
      p += sizeof(size) + b.size();
    }
    reply(out.data(), out.size());
  }
  void reply_bytes(const Bytes& b) { reply_bytes(std::vector<Bytes>{b}); }

  enum class Input { kNone, kByte, kClosed };
  // Takes the next byte off the socket if one is there, without waiting: what a client says
  // while a wait of its is pending (a 2.x client's CANCEL_WAIT), or that it left.
  Input poll_input(uint8_t& b) {
    ssize_t n = ::recv(fd_, &b, 1, MSG_DONTWAIT);
    if (n == 1) return Input::kByte;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return Input::kNone;
    return Input::kClosed;
  }
  // The client gave up (its own timeout) and closed the connection while we waited for keys.
  bool client_left() {
    uint8_t b;
    ssize_t n = ::recv(fd_, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  const std::string& context() const { return context_; }
  // The query being read, for the errors above.
  void set_query(std::string_view query) { query_ = query; }
  std::string_view query() const { return query_; }

 private:
  int fd_;
  std::string context_;
  std::string_view query_ = "the first query";
};

// kError from handle: the server is stopping. kInvalid: a request that makes no sense (ADD to
// a value that is not a number), which torch's server answers by closing the connection.
bool ok(const Response& r, const Connection& c) {
  if (r.status == Status::kOk) return true;
  if (r.status == Status::kInvalid)
    DTRAIN_LOG_WARN("{}: {}: closing the connection: {}", c.context(), c.query(), r.error);
  return false;
}

// The value an answer must carry; a store that answered without one broke its own contract.
const Bytes& first_value(const Response& r, std::string_view what, std::string_view context) {
  if (r.values.empty())
    throw InternalError(fmt::format("{}: the store answered {} without a value", context, what));
  return r.values.front();
}

// COMPARE_SET, the same in both protocols: torch answers a missing key with `expected` when that
// is not empty; dtrain's compare_set with empty.
bool compare_set(Connection& c, const TorchClientHooks& hooks) {
  Request req;
  req.command = Command::kCompareSet;
  req.keys = {c.key()};
  Bytes expected = c.blob(kMaxValueBytes, "value"), desired = c.blob(kMaxValueBytes, "value");
  req.values = {expected, desired};
  Response r = hooks.handle(req);
  if (!ok(r, c)) return false;
  Bytes out = first_value(r, "compare_set", c.context());
  if (out.empty() && !expected.empty()) out = expected;
  c.reply_bytes(out);
  return true;
}

// GET and MULTI_GET: torch's client has WAITed for the keys, so the store answers at once; a key
// deleted meanwhile ends the connection, as in torch's server.
bool get(Connection& c, const TorchClientHooks& hooks, std::vector<std::string> keys,
         std::string_view query) {
  Request req;
  req.command = keys.size() == 1 ? Command::kGet : Command::kMultiGet;
  req.keys = std::move(keys);
  Response r = hooks.handle(req);  // timeout 0
  if (r.status == Status::kTimeout) {
    DTRAIN_LOG_WARN("{}: {} of missing key(s) {}: closing the connection, as torch does",
                    c.context(), query, quote_keys(r.missing_keys));
    return false;
  }
  if (!ok(r, c)) return false;
  if (r.values.size() != req.keys.size())
    throw InternalError(fmt::format("{}: the store answered {} values to a {} of {} keys",
                                    c.context(), r.values.size(), query, req.keys.size()));
  c.reply_bytes(r.values);
  return true;
}

// Single-key and keyless queries the two protocols share, once their fields are read.
bool add(Connection& c, const TorchClientHooks& hooks) {
  Request req;
  req.command = Command::kAdd;
  req.keys = {c.key()};
  req.delta = c.value<int64_t>();
  Response r = hooks.handle(req);
  if (!ok(r, c)) return false;
  c.reply_i64(r.integer);
  return true;
}

bool integer_query(Connection& c, const TorchClientHooks& hooks, Command command,
                   std::vector<std::string> keys) {
  Request req;
  req.command = command;
  req.keys = std::move(keys);
  Response r = hooks.handle(req);
  if (!ok(r, c)) return false;
  if (command == Command::kCheck)
    c.reply_u8(r.integer == 1 ? 0 : 1);  // READY / NOT_READY
  else
    c.reply_i64(r.integer);
  return true;
}

bool set(Connection& c, const TorchClientHooks& hooks) {
  Request req;
  req.command = Command::kSet;
  req.keys = {c.key()};
  req.values = {c.blob(kMaxValueBytes, "value")};
  return ok(hooks.handle(req), c);
}

void serve_torch_1_13(Connection& c, const TorchClientHooks& hooks) {
  for (uint8_t b; c.read_query(b);) {
    if (b > static_cast<uint8_t>(Query1::kDeleteKey))
      throw ProtocolError(fmt::format("{}: unknown torch 1.13 store query {}", c.context(), b));
    c.set_query(query_name(static_cast<Query1>(b)));
    switch (static_cast<Query1>(b)) {
      case Query1::kSet:
        if (!set(c, hooks)) return;
        break;
      case Query1::kCompareSet:
        if (!compare_set(c, hooks)) return;
        break;
      case Query1::kGet:
        if (!get(c, hooks, {c.key()}, "GET")) return;
        break;
      case Query1::kAdd:
        if (!add(c, hooks)) return;
        break;
      case Query1::kCheck:
        if (!integer_query(c, hooks, Command::kCheck, c.keys())) return;
        break;
      case Query1::kWait: {
        Request req;
        req.command = Command::kWait;
        req.keys = c.keys();
        req.timeout = kWaitSlice;
        for (;;) {
          Response r = hooks.handle(req);
          if (r.status == Status::kOk) break;
          if (r.status != Status::kTimeout || c.client_left()) return;
        }
        c.reply_u8(kStopWaiting);
        break;
      }
      case Query1::kNumKeys:
        if (!integer_query(c, hooks, Command::kNumKeys, {})) return;
        break;
      case Query1::kDeleteKey:
        if (!integer_query(c, hooks, Command::kDelete, {c.key()})) return;
        break;
      case Query1::kWatchKey: {
        const std::string key = c.key();
        DTRAIN_LOG_WARN(
            "{}: torch's watch_key ('{}') is not served by dtrain's store; closing "
            "the connection",
            c.context(), key);
        return;
      }
    }
  }
}

// A 2.x wait (WAIT, BARRIER), one slice at a time, watching the socket between slices: the client
// sends nothing but CANCEL_WAIT while its wait is pending. Answers it: STOP_WAITING when `slice`
// said ready, WAIT_CANCELED when the client canceled. False when the connection is to end.
template <typename Slice>
bool wait_2(Connection& c, Slice slice, std::string_view what) {
  for (;;) {
    Response r = slice();
    if (r.status == Status::kOk) {
      c.reply_u8(kStopWaiting);
      return true;
    }
    if (r.status != Status::kTimeout) return ok(r, c);
    uint8_t b = 0;
    switch (c.poll_input(b)) {
      case Connection::Input::kNone:
        continue;
      case Connection::Input::kClosed:
        return false;
      case Connection::Input::kByte:
        if (b != static_cast<uint8_t>(Query2::kCancelWait))
          throw ProtocolError(
              fmt::format("{}: query {} ({}) while its {} was pending; torch's client sends only "
                          "CANCEL_WAIT then",
                          c.context(), b, query_name(static_cast<Query2>(b)), what));
        c.reply_u8(kWaitCanceled);
        return true;
    }
  }
}

bool refuse_2(Connection& c, Query2 q) {
  std::string what = "";
  if (q != Query2::kListKeys) what = fmt::format(" ('{}')", c.key());
  DTRAIN_LOG_WARN(
      "{}: torch's {}{} is not served by dtrain's store (it has no queues and no key listing); "
      "closing the connection",
      c.context(), query_name(q), what);
  return false;
}

void serve_torch_2(Connection& c, const TorchClientHooks& hooks) {
  for (uint8_t b; c.read_query(b);) {
    if (b > static_cast<uint8_t>(Query2::kBarrier))
      throw ProtocolError(fmt::format("{}: unknown torch 2.x store query {}", c.context(), b));
    const auto q = static_cast<Query2>(b);
    c.set_query(query_name(q));
    bool go_on = true;
    switch (q) {
      case Query2::kValidate:
        throw ProtocolError(
            fmt::format("{}: VALIDATE after the first query (torch's client sends it once, first)",
                        c.context()));
      case Query2::kPing:
        c.reply_u32(c.value<uint32_t>());
        break;
      case Query2::kSet:
        go_on = set(c, hooks);
        break;
      case Query2::kCompareSet:
        go_on = compare_set(c, hooks);
        break;
      case Query2::kGet:
        go_on = get(c, hooks, {c.key()}, "GET");
        break;
      case Query2::kMultiGet:
        go_on = get(c, hooks, c.keys(), "MULTI_GET");
        break;
      case Query2::kAdd:
        go_on = add(c, hooks);
        break;
      case Query2::kCheck:
        go_on = integer_query(c, hooks, Command::kCheck, c.keys());
        break;
      case Query2::kNumKeys:
        go_on = integer_query(c, hooks, Command::kNumKeys, {});
        break;
      case Query2::kDeleteKey:
        go_on = integer_query(c, hooks, Command::kDelete, {c.key()});
        break;
      case Query2::kAppend: {
        const std::string key = c.key();
        const Bytes suffix = c.blob(kMaxValueBytes, "value");
        go_on = ok(hooks.append(key, suffix), c);
        break;
      }
      case Query2::kMultiSet: {
        Request req;
        req.command = Command::kMultiSet;
        const uint64_t n = c.count("key-value pairs");
        uint64_t total = 0;
        for (uint64_t i = 0; i < n; ++i) {
          req.keys.push_back(c.key());
          req.values.push_back(c.blob(kMaxValueBytes, "value"));
          total += req.keys.back().size() + req.values.back().size();
          if (total > kMaxMessageBytes)
            throw ProtocolError(fmt::format(
                "{}: a MULTI_SET of {} keys ({} so far, the last '{}') is over the limit of {} "
                "bytes",
                c.context(), n, i + 1, req.keys.back(), kMaxMessageBytes));
        }
        go_on = ok(hooks.handle(req), c);
        break;
      }
      case Query2::kWait: {
        Request req;
        req.command = Command::kWait;
        req.keys = c.keys();
        req.timeout = kWaitSlice;
        go_on = wait_2(
            c, [&] { return hooks.handle(req); }, "WAIT");
        break;
      }
      case Query2::kBarrier: {
        Request req;
        req.command = Command::kAdd;
        req.keys = {c.key()};
        req.delta = 1;
        const auto world_size = c.value<int64_t>();
        if (!ok(hooks.handle(req), c)) return;
        go_on = wait_2(
            c, [&] { return hooks.wait_for_count(req.keys[0], world_size, kWaitSlice); },
            "BARRIER");
        break;
      }
      case Query2::kCancelWait:
        // A cancel that crossed our STOP_WAITING on the wire: the client reads both.
        c.reply_u8(kWaitCanceled);
        break;
      case Query2::kQueuePush:
      case Query2::kQueuePop:
      case Query2::kQueueLen:
      case Query2::kListKeys:
        go_on = refuse_2(c, q);
        break;
    }
    if (!go_on) return;
  }
}

}  // namespace

void serve_torch_client(int fd, const TorchClientHooks& hooks, std::string_view context) {
  Connection c(fd, context);
  // See the header: 2.x opens with 0 and its magic, 1.13 with a query, 0 (SET) followed by a
  // key length within kMaxKeyBytes.
  uint8_t head[9];
  if (!c.peek(head, 1)) return;
  if (head[0] != 0) return serve_torch_1_13(c, hooks);
  if (!c.peek(head, 5)) return;
  uint32_t magic;
  std::memcpy(&magic, head + 1, sizeof(magic));
  if (magic == kTorchValidateMagic) {
    uint8_t validate[5];
    net::read_all(fd, validate, sizeof(validate), Deadline::after(kBodyTimeout), context);
    DTRAIN_LOG_DEBUG("{}: speaks torch 2.x's protocol", context);
    return serve_torch_2(c, hooks);
  }
  // A 1.13 SET's key length: its low four bytes alone may already rule it out.
  uint64_t key_length = magic;
  if (key_length <= kMaxKeyBytes) {
    if (!c.peek(head, 9)) return;
    std::memcpy(&key_length, head + 1, sizeof(key_length));
  }
  if (key_length <= kMaxKeyBytes) return serve_torch_1_13(c, hooks);
  throw ProtocolError(fmt::format(
      "{}: refused: the connection opened with query 0 followed by 0x{:08x}, which is neither "
      "torch 2.x's VALIDATE magic 0x{:08x} nor the key length of a torch 1.13 SET (at most {} "
      "bytes)",
      context, magic, kTorchValidateMagic, kMaxKeyBytes));
}

}  // namespace dtrain::store
