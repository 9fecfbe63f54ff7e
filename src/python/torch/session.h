// Session: what hvd.init() sets up for dtrain.torch's Horovod-compatible API, on the dtrain group
// under torch.distributed's default group:
//   - a group of its own for the calls that block (allreduce, allgather, broadcast, alltoall,
//     barrier), run on the calling thread with the GIL released;
//   - a Coordinator on another group for the asynchronous, named all-reduces
//     (allreduce_async_, DistributedOptimizer's gradients, join), negotiated and fused exactly as
//     for C++'s DistributedOptimizer.
// Free of pybind11: src/python/torch/module.cc binds it.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dtrain/process_group.h"
#include "torch/coordinator.h"
#include "torch/gradient_hooks.h"

namespace dtrain::python {

struct SessionOptions {
  std::chrono::microseconds cycle_time{1000};        // DTRAIN_CYCLE_TIME_MS
  size_t fusion_threshold_bytes = size_t{64} << 20;  // DTRAIN_FUSION_THRESHOLD
  std::chrono::milliseconds stall_timeout{60000};    // DTRAIN_STALL_TIMEOUT
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

  // Blocking collectives on contiguous CPU tensors, in place where the name ends in _.
  void allreduce_(const at::Tensor& tensor, ReduceOp op, double prescale, double postscale);
  void broadcast_(const at::Tensor& tensor, int root);
  // Concatenation along dimension 0; the first dimension may differ between ranks.
  at::Tensor allgather(const at::Tensor& tensor);
  // Slices of dimension 0 (splits[j] rows to rank j; equal slices when splits is empty) go to
  // each rank; returns what arrived and how many rows came from each rank.
  std::pair<at::Tensor, at::Tensor> alltoall(const at::Tensor& tensor,
                                             const std::vector<int64_t>& splits);
  void barrier();

  // Through the coordinator: tensors of one name match across ranks; fused with others.
  std::shared_ptr<AsyncAllreduce> allreduce_async_(const at::Tensor& tensor,
                                                   const std::string& name, ReduceOp op,
                                                   double prescale, double postscale);
  std::shared_ptr<AsyncAllreduce> join();
  // Hooks on `named_parameters` that submit each gradient to this session's coordinator.
  std::unique_ptr<GradientHooks> gradient_hooks(
      std::vector<std::pair<std::string, at::Tensor>> named_parameters,
      GradientHooksOptions options);

 private:
  std::chrono::milliseconds wait_limit() const;
  void open() const;  // throws once closed

  std::shared_ptr<ProcessGroup> ops_;
  SessionOptions options_;
  std::shared_ptr<Coordinator> coordinator_;
};

}  // namespace dtrain::python
