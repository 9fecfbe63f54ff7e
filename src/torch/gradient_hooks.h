// GradientHooks: each parameter's gradient handed to a Coordinator the moment autograd has
// accumulated it (a post hook on the parameter's gradient accumulator), and a synchronize()
// that waits until every gradient holds the reduction over the ranks.
//
// The engine of DistributedOptimizer, and the same engine under Python's Horovod-compatible
// dtrain.torch.DistributedOptimizer, which wraps a Python optimizer around these hooks: one
// implementation of accumulation over backward passes, fp16 compression and scaling.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dtrain/reduce_op.h"
#include "dtrain/torch/distributed_optimizer.h"

namespace torch::autograd {
struct Node;
}

namespace dtrain {

class Coordinator;

struct GradientHooksOptions {
  // Backward passes whose gradients accumulate (sum) before the reduction is submitted.
  int backward_passes_per_step = 1;
  Compression compression = Compression::kNone;
  ReduceOp op = ReduceOp::kAvg;
  // gradient *= prescale before the reduction and *= postscale after it (1 = untouched).
  double prescale = 1.0;
  double postscale = 1.0;
  // Longest wait for one gradient in synchronize(): the coordinator's stall timeout plus one
  // collective's timeout.
  std::chrono::milliseconds wait_limit{360000};
};

class GradientHooks {
 public:
  // named_parameters: names equal on every rank; parameters without requires_grad are skipped.
  // rank: for the errors.
  GradientHooks(std::shared_ptr<Coordinator> coordinator,
                std::vector<std::pair<std::string, at::Tensor>> named_parameters,
                GradientHooksOptions options, int rank);
  ~GradientHooks();  // removes the hooks
  GradientHooks(const GradientHooks&) = delete;
  GradientHooks& operator=(const GradientHooks&) = delete;

  // Submits the gradients no hook submitted yet (a parameter without a gradient reduces zeros)
  // and waits until every one holds the reduction.
  void synchronize();
  // synchronize() in pieces, for a caller that must look up between waits (Python, for Ctrl-C):
  // submit_missing(), then wait_some(slice) until it returns true.
  void submit_missing();
  bool wait_some(std::chrono::milliseconds slice);
  // True while a reduction was submitted and not yet waited for by synchronize().
  bool pending() const;
  void set_backward_passes_per_step(int passes);
  size_t size() const { return slots_.size(); }

 private:
  struct Slot;
  void on_grad_ready(size_t index);
  void submit(size_t index);
  void finish(Slot& slot);

  std::shared_ptr<Coordinator> coordinator_;
  GradientHooksOptions options_;
  int rank_;
  std::vector<std::unique_ptr<Slot>> slots_;
  size_t waited_ = 0;  // slots synchronize() has finished, in order
  std::chrono::steady_clock::time_point submitted_at_;
};

}  // namespace dtrain
