// The wire format between TcpStore (client) and TcpStoreServer, spoken after the handshake.
//
//   request   u8 command | i64 delta | u64 timeout_ms | list keys | list values
//   response  u8 status  | i64 integer | list values | list missing_keys | blob error
//   list      u64 count | count * blob
//   blob      u64 size | size bytes
//
// Integers are little-endian. One request, then one response: the client never pipelines.
// Every count and size is checked against the limits below before anything is read, and a blob
// grows only as its bytes actually arrive, so garbage on the socket can neither crash the
// server nor make it allocate more memory than the sender really sent.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/deadline.h"
#include "dtrain/error.h"
#include "dtrain/store.h"

namespace dtrain::store {

inline constexpr uint64_t kMaxKeyBytes = 64 * 1024;
inline constexpr uint64_t kMaxValueBytes = uint64_t{1} << 30;    // 1 GiB
inline constexpr uint64_t kMaxItems = uint64_t{1} << 20;         // keys or values per message
inline constexpr uint64_t kMaxMessageBytes = uint64_t{4} << 30;  // every blob of one message
inline constexpr uint64_t kMaxErrorBytes = 64 * 1024;

enum class Command : uint8_t {
  kSet = 1,
  kGet = 2,
  kAdd = 3,
  kCompareSet = 4,
  kCheck = 5,
  kWait = 6,
  kDelete = 7,
  kNumKeys = 8,
  kMultiGet = 9,
  kMultiSet = 10,
};
std::string_view command_name(Command command);

enum class Status : uint8_t {
  kOk = 0,
  kTimeout = 1,  // a get/wait ran out of time; missing_keys says which keys never appeared
  kError = 2,    // the server failed the request; error says why
  kInvalid = 3,  // the request makes no sense (add to a non-integer value); error says why
};

struct Request {
  Command command = Command::kGet;
  std::vector<std::string> keys{};
  std::vector<Bytes>
      values{};       // set: 1, compare_set: expected then desired, multi_set: one per key
  int64_t delta = 0;  // add
  std::chrono::milliseconds timeout{0};  // how long the server may wait for keys (get, wait)
};

struct Response {
  Status status = Status::kOk;
  int64_t integer = 0;                      // add: new value; check, delete: 0/1; num_keys: count
  std::vector<Bytes> values{};              // get, multi_get, compare_set
  std::vector<std::string> missing_keys{};  // with kTimeout
  std::string error{};                      // with kError and kInvalid
};

// Bytes on the wire that do not form a valid message (bad command, size over a limit, ...).
class ProtocolError : public StoreError {
 public:
  explicit ProtocolError(const std::string& m) : StoreError(m) {}
};

// Throws InvalidArgumentError when keys or values exceed the limits; stores call it before
// sending or writing so that the user learns which key or value is too large.
void check_limits(const std::vector<std::string>& keys, const std::vector<Bytes>& values,
                  std::string_view context);

std::vector<uint8_t> encode_request(const Request& request);
std::vector<uint8_t> encode_response(const Response& response);

// Server side: waits (without limit: the server's stop() shuts the socket down) for the next
// request, then reads the rest of it by `body_deadline`. Returns nullopt when the client closed
// the connection between requests. Throws ProtocolError on malformed bytes, PeerFailureError
// or TimeoutError when the client vanished or stalled mid-request.
std::optional<Request> read_request(int fd, std::chrono::milliseconds body_timeout,
                                    std::string_view context);

// Client side: reads one response by `deadline`.
Response read_response(int fd, const Deadline& deadline, std::string_view context);

}  // namespace dtrain::store
