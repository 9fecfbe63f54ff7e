// Request: one send or receive posted on a pair, and its progress. The caller waits on it
// (wait_request and wait_requests in wait.h); the pair's mutex guards everything that moves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/completion.h"
#include "common/deadline.h"
#include "dtrain/reduce_op.h"
#include "dtrain/tensor.h"
#include "transport/frame.h"

namespace dtrain::transport {

class Pair;

struct Request {
  enum class Kind : uint8_t { kSend, kRecv };

  Kind kind = Kind::kSend;
  uint64_t tag = 0;
  std::byte* data = nullptr;
  size_t size = 0;
  uint64_t seq = 0;   // n-th send (or receive) on this pair, from 1
  std::string owned;  // sends: a payload the request carries itself (control messages)
  Deadline deadline = Deadline::never();
  Completion completion;

  // Progress, guarded by the pair's mutex.
  struct Wire {
    FrameHeader header;
    CmaDescriptor cma;     // follows the header only for kFrameCma frames
  } wire;                  // sends: what goes on the stream before the payload
  bool cma = false;        // sends: the payload stays put; the receiver copies it out
  size_t header_done = 0;  // sends: wire bytes written
  size_t prefix() const { return cma ? sizeof(Wire) : sizeof(FrameHeader); }
  size_t stream_size() const { return cma ? 0 : size; }
  size_t done = 0;            // payload bytes moved
  bool matched = false;       // receives: an incoming frame is being read into this request
  uint64_t expected_aux = 0;  // receives: fail unless the frame's aux equals this (0 = any)
  uint64_t received_aux = 0;  // receives: the aux of a frame that did not match
  // Receives: combine the payload into `data` (data[i] = data[i] op payload[i]) instead of
  // overwriting it; see Pair::irecv_reduce.
  struct Reduction {
    DType dtype;
    ReduceOp op;
  };
  std::optional<Reduction> reduce;

  std::shared_ptr<Pair> pair;

  // "send #3 to rank 1 (127.0.0.1:4567, tcp), tag 7, 4096 bytes"
  std::string describe() const;
};

}  // namespace dtrain::transport
