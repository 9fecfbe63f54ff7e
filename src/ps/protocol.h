// The parameter server's wire protocol. After the dtrain handshake (role kPsClient, the worker's
// index as its rank), a worker sends requests and the server answers each with a response that
// echoes the request's id; answers to requests that must wait (a sync pull) may overtake others.
//
// Every message is a 64-byte little-endian Header followed by `bytes` of payload:
//   create_dense   JSON spec (header.count bytes), then the slice's initial f32 values
//   create_sparse  JSON spec
//   push           count f32 gradients for elements [offset, offset + count) of the tensor
//   pull           -                          -> count f32 values
//   push_pull      count f32 gradients        -> count f32 values that include them
//   push_rows      count u64 ids, then count * width f32 gradients
//   pull_rows      count u64 ids              -> count * width f32 values
//   checkpoint     -                          -> JSON {"path": ...}
//   bye            -                          (no answer: the worker is leaving)
// A failed request is answered with status != kOk and a UTF-8 message as payload.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "common/byte_order.h"
#include "common/deadline.h"

namespace dtrain::ps {

inline constexpr uint32_t kWireMagic = 0x53505444;  // "DTPS"

enum class Op : uint8_t {
  kCreateDense = 1,
  kCreateSparse = 2,
  kPush = 3,
  kPull = 4,
  kPushPull = 5,
  kPushRows = 6,
  kPullRows = 7,
  kCheckpoint = 8,
  kBye = 9,
  kForget = 10,  // worker `offset` is gone for good: the others go on without it
};
const char* to_string(Op op);

enum class Status : uint8_t {
  kOk = 0,
  kInvalid = 1,      // a bad request: nothing changed
  kTimeout = 2,      // a parked request waited past its limit
  kPeerFailure = 3,  // a worker it waited for died
  kInternal = 4,
};

// On the wire as it is: little-endian fields (common/byte_order.h), no padding.
struct Header {
  Le<uint32_t> magic = kWireMagic;
  uint8_t op = 0;
  uint8_t status = 0;
  uint8_t dtype = 0;  // DType of the values (requests), checked against the table's
  uint8_t flags = 0;
  Le<uint64_t> id = 0;          // request id, echoed by the response
  Le<uint64_t> table = 0;       // table_key(name)
  Le<uint64_t> offset = 0;      // dense: first element, in the whole tensor
  Le<uint64_t> count = 0;       // dense: elements; sparse: rows; create: JSON bytes
  Le<uint64_t> width = 0;       // sparse: floats per row
  Le<uint64_t> bytes = 0;       // payload bytes after the header
  Le<uint32_t> timeout_ms = 0;  // how long the server may hold the request
  Le<uint32_t> reserved = 0;
};
static_assert(sizeof(Header) == 64);

// The largest payload a server accepts (1 GiB: a garbage header must not make it allocate
// terabytes). Dense pushes travel in 1 MiB chunks; split sparse pushes beyond this.
inline constexpr uint64_t kMaxPayload = uint64_t{1} << 30;

// FNV-1a of the name: how requests name tables (names travel only with create).
uint64_t table_key(std::string_view name);

// Sends the header and the payload parts in as few system calls as the socket allows; throws
// TimeoutError / PeerFailureError with `context`.
void send_message(int fd, const Header& header, std::span<const std::span<const std::byte>> parts,
                  const Deadline& deadline, std::string_view context);
inline void send_message(int fd, const Header& header, const Deadline& deadline,
                         std::string_view context) {
  send_message(fd, header, {}, deadline, context);
}

// Reads a header and checks its magic and payload size; throws InvalidArgumentError describing
// what arrived instead (garbage on the port).
Header read_header(int fd, const Deadline& deadline, std::string_view context);

}  // namespace dtrain::ps
