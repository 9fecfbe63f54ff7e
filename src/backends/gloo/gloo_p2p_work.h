// The Work of one gloo send or receive. Gloo's unbound buffers can only be waited on (a wait
// that runs out closes every pair of the context), never tested, so each operation has a
// waiter thread that waits once, until the operation's deadline, and records how it ended:
// is_completed() then never blocks, and wait(timeout) waits on that record. A wait that gives
// up before the deadline, or abort(), cancels the operation: it interrupts gloo's wait and
// destroys the unbound buffer, which gloo's pairs only hold weakly, so nothing is written into
// the caller's memory afterwards.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "common/completion.h"
#include "common/deadline.h"
#include "dtrain/tensor.h"
#include "dtrain/work.h"

namespace dtrain::backends {

class GlooP2pWork : public Work {
 public:
  enum class Kind { kSend, kRecv };
  // Posts the operation on `context` (peer and slot in gloo's terms) and starts its waiter.
  // `what` names it: "rank 0: send of 4096 bytes to rank 1 (tag 3) of group world".
  GlooP2pWork(gloo::Context& context, Kind kind, const TensorView& tensor, int peer, uint64_t slot,
              Deadline deadline, std::string what);
  ~GlooP2pWork() override;

  bool is_completed() override { return completion_.done(); }
  void wait_until_done(std::optional<std::chrono::milliseconds> timeout) override;
  std::exception_ptr exception() const override { return completion_.error(); }

  // Ends the operation now with `error` (if it has not ended yet).
  void cancel(std::exception_ptr error);

 private:
  void run();

  Kind kind_;
  Deadline deadline_;
  std::string what_;
  size_t bytes_;
  Completion completion_;
  std::mutex mu_;  // guards buffer_ (the waiter destroys it; cancel() interrupts its wait)
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
  std::exception_ptr cancel_error_;  // why cancel() interrupted the wait; under mu_
  std::jthread waiter_;
};

}  // namespace dtrain::backends
