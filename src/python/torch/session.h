// Session: what hvd.init() sets up for dtrain.torch's Horovod-compatible API, on the dtrain group
// under torch.distributed's default group:
//   - NegotiatedCalls on a group of its own for the blocking allreduce, allgather, broadcast,
//     alltoall and barrier, on the calling thread with the GIL released: the ranks agree on each
//     call before its data moves, so ranks that disagree all get an error and the session goes
//     on, as in Horovod;
//   - a Coordinator on another group for the asynchronous calls, matched across ranks by name:
//     all-reduces (allreduce_async_, DistributedOptimizer's gradients), negotiated and fused
//     exactly as for C++'s DistributedOptimizer, and allgather, broadcast, alltoall.
// join() joins both.
// Free of pybind11: src/python/torch/module.cc binds it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dtrain/process_group.h"
#include "horovod/coordinator.h"
#include "horovod/negotiated_calls.h"
#include "torch/gradient_hooks.h"

namespace dtrain::python {

// What the Python layer reads from DTRAIN_CYCLE_TIME_MS, DTRAIN_FUSION_THRESHOLD and
// DTRAIN_STALL_TIMEOUT; by default the coordinator's own defaults.
struct SessionOptions {
  std::chrono::microseconds cycle_time = CoordinatorOptions{}.cycle_time;
  size_t fusion_threshold_bytes = CoordinatorOptions{}.fusion_threshold_bytes;
  std::chrono::milliseconds stall_timeout = CoordinatorOptions{}.stall_timeout;
};

// An all-reduce submitted to the coordinator: its tensor stays alive with it, and the scaling
// after the reduction is applied once, by the first wait that sees it done.
class AsyncAllreduce {
 public:
  AsyncAllreduce(std::shared_ptr<Coordinator::Handle> handle, at::Tensor tensor, double postscale,
                 std::chrono::milliseconds limit);
  // Waits up to `slice`; true once the tensor holds the result. Throws the coordinator's error,
  // or TimeoutError once `limit` has passed since submission.
  bool wait_some(std::chrono::milliseconds slice);
  bool done() const { return handle_->done(); }
  const at::Tensor& tensor() const { return tensor_; }
  int last_joined() const { return handle_->last_joined(); }

 private:
  std::shared_ptr<Coordinator::Handle> handle_;
  at::Tensor tensor_;
  double postscale_;
  std::chrono::milliseconds limit_;
  std::chrono::steady_clock::time_point submitted_ = std::chrono::steady_clock::now();
  bool finished_ = false;
};

// An allgather, broadcast or alltoall: queued on the coordinator (asynchronous), or already done
// (blocking). What it produces is read once it is done.
class AsyncCall {
 public:
  struct Result {
    at::Tensor output;
    at::Tensor received;  // alltoall: the rows that came from each rank
  };
  // A null `handle`: the call already finished.
  AsyncCall(std::shared_ptr<Coordinator::Handle> handle, std::shared_ptr<Result> result,
            std::chrono::milliseconds limit);
  // Waits up to `slice`; true once done. Throws the call's error, or TimeoutError once `limit`
  // has passed since submission.
  bool wait_some(std::chrono::milliseconds slice);
  bool done() const { return handle_ == nullptr || handle_->done(); }
  at::Tensor output() const { return result_ ? result_->output : at::Tensor(); }
  at::Tensor received() const { return result_ ? result_->received : at::Tensor(); }

 private:
  std::shared_ptr<Coordinator::Handle> handle_;
  std::shared_ptr<Result> result_;
  std::chrono::milliseconds limit_;
  std::chrono::steady_clock::time_point submitted_ = std::chrono::steady_clock::now();
};

class Session {
 public:
  // Collective over `world`'s ranks.
  Session(const std::shared_ptr<ProcessGroup>& world, SessionOptions options);
  // Collective: stops the coordinator once every rank's session is closing (close() does it
  // earlier, without the caller holding Python's GIL).
  ~Session();
  void close();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const { return ops_->rank(); }
  // The group of the blocking collectives (what Ctrl-C aborts).
  const std::shared_ptr<ProcessGroup>& group() const { return ops_; }
  int size() const { return ops_->size(); }

  // Collectives on contiguous CPU tensors, in place where the name ends in _: blocking, or
  // asynchronous (`async_op`: queued on the coordinator under `name`, which every rank gives and
  // which is unique among the calls in flight). The result comes back through the AsyncCall (a
  // finished one for a blocking call). A blocking call's `name`, when not empty, must be the same
  // on every rank.
  void allreduce_(const at::Tensor& tensor, ReduceOp op, double prescale, double postscale,
                  const std::string& name);
  std::shared_ptr<AsyncCall> broadcast_(const at::Tensor& tensor, int root, const std::string& name,
                                        bool async_op);
  // Concatenation along dimension 0; the first dimension may differ between ranks.
  std::shared_ptr<AsyncCall> allgather(const at::Tensor& tensor, const std::string& name,
                                       bool async_op);
  // Slices of dimension 0 (splits[j] rows to rank j; equal slices when splits is empty) go to
  // each rank; the output is what arrived, `received` how many rows came from each rank.
  std::shared_ptr<AsyncCall> alltoall(const at::Tensor& tensor, const std::vector<int64_t>& splits,
                                      const std::string& name, bool async_op);
  void barrier();

  // Through the coordinator: tensors of one name match across ranks; fused with others.
  std::shared_ptr<AsyncAllreduce> allreduce_async_(const at::Tensor& tensor,
                                                   const std::string& name, ReduceOp op,
                                                   double prescale, double postscale);
  // This rank has run out of data: the blocking calls take its zeros until every rank has joined
  // (returns then), and so do the coordinator's all-reduces, until the handle is done (it says
  // who joined last).
  std::shared_ptr<AsyncAllreduce> join();
  // Hooks on `named_parameters` that submit each gradient to this session's coordinator.
  std::unique_ptr<GradientHooks> gradient_hooks(
      std::vector<std::pair<std::string, at::Tensor>> named_parameters,
      GradientHooksOptions options);

 private:
  std::chrono::milliseconds wait_limit() const;
  void open() const;  // throws once closed
  // A blocking call: `check` validates this rank's arguments (when it throws, the other ranks'
  // calls fail too), then `body` runs once every rank made the same call.
  void run(const Call& call, const std::function<void()>& check, const NegotiatedCalls::Body& body);
  // An asynchronous call: `check`, then `body` queued on the coordinator under `name`.
  std::shared_ptr<AsyncCall> queue(const Call& call, const std::string& name,
                                   const std::function<void()>& check,
                                   std::function<void(ProcessGroup&)> body,
                                   std::shared_ptr<AsyncCall::Result> result);

  std::shared_ptr<ProcessGroup> ops_;
  std::unique_ptr<NegotiatedCalls> calls_;
  SessionOptions options_;
  std::shared_ptr<Coordinator> coordinator_;
};

}  // namespace dtrain::python
