// DistributedOptimizer: Horovod's way of data parallelism. Wraps any LibTorch optimizer; the
// gradients are averaged over the ranks before step().
//
//   auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(), 0.01);
//   dtrain::broadcast_parameters(*model, *pg, 0);                 // everyone starts equal
//   dtrain::DistributedOptimizer opt(sgd, *model, pg);
//   loss.backward();   // each gradient is queued for all-reduce as soon as it is ready
//   opt.step();        // waits for the averages, then sgd->step()
//
// A background thread runs cycles (every cycle_time): rank 0 learns which named gradients each
// rank has ready and answers with those ready on every rank, in one order, so ranks whose hooks
// fire in different orders still reduce the same tensors together. Ready tensors of a dtype are
// fused into one buffer up to fusion_threshold_bytes per all-reduce; once an order was agreed it
// is cached and later cycles exchange one bit per tensor instead of names. A tensor submitted by
// some ranks and not others fails, after stall_timeout, with an error naming it and the ranks.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dtrain/process_group.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace dtrain {

class Coordinator;
class GradientHooks;

enum class Compression { kNone, kFp16 };

struct DistributedOptimizerOptions {
  // Backward passes accumulated (summed, as Horovod does) before the gradients are reduced;
  // call step() once per that many backward passes.
  int backward_passes_per_step = 1;
  Compression compression = Compression::kNone;      // kFp16: half the bytes on the wire
  ReduceOp op = ReduceOp::kAvg;                      // kSum adds the gradients up instead
  size_t fusion_threshold_bytes = size_t{64} << 20;  // per fused all-reduce
  std::chrono::microseconds cycle_time{1000};
  std::chrono::milliseconds stall_timeout{60000};  // a tensor missing on some ranks
  size_t cache_capacity = 1024;                    // tensors whose agreed order is cached
  std::chrono::milliseconds timeout{0};            // of each collective; 0 = the group's
};

class DistributedOptimizer {
 public:
  // Collective. named_parameters: the parameters to average, each under a name that is the same
  // on every rank (the module's names when given a module).
  DistributedOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer,
                       std::vector<std::pair<std::string, at::Tensor>> named_parameters,
                       std::shared_ptr<ProcessGroup> group,
                       DistributedOptimizerOptions options = {});
  DistributedOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer,
                       torch::nn::Module& module, std::shared_ptr<ProcessGroup> group,
                       DistributedOptimizerOptions options = {});
  // Collective: stops the background thread once every rank's optimizer is being destroyed.
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // Queues the gradients no hook queued yet (unused parameters reduce zeros) and waits until
  // every gradient holds the average over the ranks.
  void synchronize();
  // synchronize(), then the wrapped optimizer's step().
  void step();
  void zero_grad();
  torch::optim::Optimizer& optimizer() { return *optimizer_; }

 private:
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::shared_ptr<Coordinator> coordinator_;
  std::unique_ptr<GradientHooks> hooks_;  // destroyed before the coordinator
};

}  // namespace dtrain
