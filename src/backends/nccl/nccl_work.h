// The Work of one NCCL operation already on its stream: done when the CUDA event recorded after
// it has completed. wait() polls that event and the communicator's asynchronous error (a peer
// that died fails the operation within a poll), backing off from yielding to short sleeps.
//
// NCCL cannot cancel one operation: when the limit passes, the whole communicator is aborted
// (ncclCommAbort, which ends the kernels in flight), and the TimeoutError says so and names the
// rank, the operation, its sequence number, its bytes and the limit. The group is unusable from
// then on, on this rank; the peers' own operations fail at their limits, or at once when NCCL
// tells them this rank went away.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "backends/nccl/nccl_comm.h"
#include "comm/cuda/cuda_runtime.h"
#include "common/completion.h"
#include "common/deadline.h"
#include "dtrain/work.h"

namespace dtrain::backends::nccl {

class NcclWork : public Work {
 public:
  // `what`: "rank 0: all_reduce of f32 x 1024 (4096 bytes) sum as collective #3 of group world
  // (nccl, cuda:0)"; `done` was recorded on the stream right after the operation.
  NcclWork(std::shared_ptr<NcclComm> comm, std::shared_ptr<cuda::Event> done, std::string what,
           Deadline deadline);
  // A Work that failed before it started.
  static std::shared_ptr<NcclWork> failed(std::exception_ptr error);

  bool is_completed() override;
  void wait_until_done(std::optional<std::chrono::milliseconds> timeout) override;
  std::exception_ptr exception() const override { return completion_.error(); }

  // Fails it now with `error` (the group was aborted); the communicator is aborted by the caller.
  void cancel(std::exception_ptr error) { completion_.fail(std::move(error)); }

 private:
  NcclWork() = default;
  // One look: the event, then NCCL's error state. True once complete. Caller holds mu_.
  bool poll_locked();
  // Aborts the communicator and fails the Work: `limit` passed. Caller holds mu_.
  void time_out_locked(const Deadline& limit);

  std::shared_ptr<NcclComm> comm_;
  std::shared_ptr<cuda::Event> done_;
  std::string what_;
  Deadline deadline_ = Deadline::never();
  std::mutex mu_;  // one poller at a time (the event and the communicator are shared)
  Completion completion_;
};

}  // namespace dtrain::backends::nccl
