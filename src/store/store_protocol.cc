#include "store/store_protocol.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/byte_order.h"
#include "common/socket.h"

namespace dtrain::store {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the store protocol writes host integers as little-endian");

// Blobs are read in chunks of this size so that memory grows with the bytes received, not with
// the size a (possibly garbage) header claims.
constexpr uint64_t kReadChunk = uint64_t{1} << 20;

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(v); }
  void u64(uint64_t v) { ByteWriter(out_).u64(v); }
  void i64(int64_t v) { ByteWriter(out_).i64(v); }
  template <typename Blob>
  void blob(const Blob& b) {
    u64(b.size());
    raw(b.data(), b.size());
  }
  template <typename Blob>
  void list(const std::vector<Blob>& items) {
    u64(items.size());
    for (const auto& b : items) blob(b);
  }
  void reserve(size_t n) { out_.reserve(n); }
  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  void raw(const void* p, size_t n) {
    auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  std::vector<uint8_t> out_;
};

template <typename Blob>
size_t list_bytes(const std::vector<Blob>& items) {
  size_t n = sizeof(uint64_t);
  for (const auto& b : items) n += sizeof(uint64_t) + b.size();
  return n;
}

class Reader {
 public:
  Reader(int fd, const Deadline& deadline, std::string_view context)
      : fd_(fd), deadline_(deadline), context_(context) {}

  uint8_t u8() {
    uint8_t v = 0;
    net::read_all(fd_, &v, sizeof(v), deadline_, context_);
    return v;
  }
  uint64_t u64() { return integer<uint64_t>(); }
  int64_t i64() { return integer<int64_t>(); }

  template <typename T>
  T integer() {
    unsigned char bytes[sizeof(T)];
    net::read_all(fd_, bytes, sizeof(bytes), deadline_, context_);
    return load_le<T>(bytes);
  }

  // A blob of at most `limit` bytes; `what` names it in the error.
  template <typename Blob>
  Blob blob(uint64_t limit, std::string_view what) {
    uint64_t size = u64();
    if (size > limit)
      throw ProtocolError(fmt::format("{}: {} of {} bytes exceeds the limit of {} bytes", context_,
                                      what, size, limit));
    total_ += size;
    if (total_ > kMaxMessageBytes)
      throw ProtocolError(fmt::format("{}: message of more than {} bytes exceeds the limit of {}",
                                      context_, total_, kMaxMessageBytes));
    Blob b;
    uint64_t done = 0;
    while (done < size) {
      uint64_t chunk = std::min(size - done, kReadChunk);
      b.resize(done + chunk);
      net::read_all(fd_, b.data() + done, chunk, deadline_, context_);
      done += chunk;
    }
    return b;
  }

  template <typename Blob>
  std::vector<Blob> list(uint64_t item_limit, std::string_view what) {
    uint64_t count = u64();
    if (count > kMaxItems)
      throw ProtocolError(fmt::format("{}: {} {} exceed the limit of {} per message", context_,
                                      count, what, kMaxItems));
    std::vector<Blob> items;
    items.reserve(std::min<uint64_t>(count, 1024));
    for (uint64_t i = 0; i < count; ++i) items.push_back(blob<Blob>(item_limit, what));
    return items;
  }

 private:
  int fd_;
  const Deadline& deadline_;
  std::string_view context_;
  uint64_t total_ = 0;
};

bool valid_command(uint8_t c) {
  return c >= static_cast<uint8_t>(Command::kSet) && c <= static_cast<uint8_t>(Command::kMultiSet);
}

}  // namespace

std::string_view command_name(Command command) {
  switch (command) {
    case Command::kSet:
      return "set";
    case Command::kGet:
      return "get";
    case Command::kAdd:
      return "add";
    case Command::kCompareSet:
      return "compare_set";
    case Command::kCheck:
      return "check";
    case Command::kWait:
      return "wait";
    case Command::kDelete:
      return "delete_key";
    case Command::kNumKeys:
      return "num_keys";
    case Command::kMultiGet:
      return "multi_get";
    case Command::kMultiSet:
      return "multi_set";
  }
  return "unknown command";
}

void check_limits(const std::vector<std::string>& keys, const std::vector<Bytes>& values,
                  std::string_view context) {
  if (keys.size() > kMaxItems || values.size() > kMaxItems)
    throw InvalidArgumentError(
        fmt::format("{}: {} keys and {} values; at most {} are allowed per call", context,
                    keys.size(), values.size(), kMaxItems));
  uint64_t total = 0;
  for (const auto& k : keys) {
    if (k.size() > kMaxKeyBytes)
      throw InvalidArgumentError(
          fmt::format("{}: a key of {} bytes exceeds the limit of {} bytes; "
                      "use shorter keys",
                      context, k.size(), kMaxKeyBytes));
    total += k.size();
  }
  for (const auto& v : values) {
    if (v.size() > kMaxValueBytes)
      throw InvalidArgumentError(
          fmt::format("{}: a value of {} bytes exceeds the limit of {} bytes; "
                      "the store is for rendezvous, not bulk data",
                      context, v.size(), kMaxValueBytes));
    total += v.size();
  }
  if (total > kMaxMessageBytes)
    throw InvalidArgumentError(
        fmt::format("{}: {} bytes in one call exceed the limit of {} bytes; "
                    "split the call",
                    context, total, kMaxMessageBytes));
}

std::vector<uint8_t> encode_request(const Request& request) {
  Writer w;
  w.reserve(1 + 8 + 8 + list_bytes(request.keys) + list_bytes(request.values));
  w.u8(static_cast<uint8_t>(request.command));
  w.i64(request.delta);
  w.u64(static_cast<uint64_t>(std::max<int64_t>(request.timeout.count(), 0)));
  w.list(request.keys);
  w.list(request.values);
  return w.take();
}

std::vector<uint8_t> encode_response(const Response& response) {
  Writer w;
  w.reserve(1 + 8 + list_bytes(response.values) + list_bytes(response.missing_keys) + 8 +
            response.error.size());
  w.u8(static_cast<uint8_t>(response.status));
  w.i64(response.integer);
  w.list(response.values);
  w.list(response.missing_keys);
  w.blob(std::string_view(response.error).substr(0, kMaxErrorBytes));
  return w.take();
}

std::optional<Request> read_request(int fd, std::chrono::milliseconds body_timeout,
                                    std::string_view context) {
  // The first byte may take forever (an idle client); stop() wakes us by shutting the socket.
  uint8_t command = 0;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, -1) < 0 && errno != EINTR)
      throw PeerFailureError(fmt::format("{}: poll failed: {}", context, std::strerror(errno)));
    ssize_t n = ::recv(fd, &command, 1, MSG_DONTWAIT);
    if (n == 1) break;
    if (n == 0) return std::nullopt;
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
    if (errno == ECONNRESET) return std::nullopt;
    throw PeerFailureError(fmt::format("{}: connection lost: {}", context, std::strerror(errno)));
  }
  if (!valid_command(command))
    throw ProtocolError(fmt::format("{}: unknown command byte {}", context, command));

  Deadline deadline = Deadline::after(body_timeout);
  Reader r(fd, deadline, context);
  Request req;
  req.command = static_cast<Command>(command);
  req.delta = r.i64();
  uint64_t timeout_ms = r.u64();
  // Clamped so that deadlines computed from it cannot overflow; a year is "forever" here.
  constexpr uint64_t kMaxWaitMs = uint64_t{365} * 24 * 3600 * 1000;
  req.timeout = std::chrono::milliseconds(std::min(timeout_ms, kMaxWaitMs));
  req.keys = r.list<std::string>(kMaxKeyBytes, "key");
  req.values = r.list<Bytes>(kMaxValueBytes, "value");
  return req;
}

Response read_response(int fd, const Deadline& deadline, std::string_view context) {
  Reader r(fd, deadline, context);
  Response resp;
  uint8_t status = r.u8();
  if (status > static_cast<uint8_t>(Status::kInvalid))
    throw ProtocolError(fmt::format("{}: unknown response status {}", context, status));
  resp.status = static_cast<Status>(status);
  resp.integer = r.i64();
  resp.values = r.list<Bytes>(kMaxValueBytes, "value");
  resp.missing_keys = r.list<std::string>(kMaxKeyBytes, "key");
  resp.error = r.blob<std::string>(kMaxErrorBytes, "error message");
  return resp;
}

}  // namespace dtrain::store
