// DistributedOptimizer: a Coordinator on a group of its own, GradientHooks on the parameters, and
// a step() that waits for the averages.
#include "dtrain/torch/distributed_optimizer.h"

#include <numeric>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "dtrain/error.h"
#include "dtrain/timeline.h"
#include "horovod/coordinator.h"
#include "torch/gradient_hooks.h"

namespace dtrain {

namespace {

std::vector<std::pair<std::string, at::Tensor>> named(torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : module.named_parameters(true)) out.emplace_back(p.key(), p.value());
  return out;
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer,
                                           torch::nn::Module& module,
                                           std::shared_ptr<ProcessGroup> group,
                                           DistributedOptimizerOptions options)
    : DistributedOptimizer(std::move(optimizer), named(module), std::move(group), options) {}

DistributedOptimizer::DistributedOptimizer(
    std::shared_ptr<torch::optim::Optimizer> optimizer,
    std::vector<std::pair<std::string, at::Tensor>> named_parameters,
    std::shared_ptr<ProcessGroup> group, DistributedOptimizerOptions options)
    : optimizer_(std::move(optimizer)) {
  if (optimizer_ == nullptr || group == nullptr)
    throw InvalidArgumentError("DistributedOptimizer: optimizer and process group must be set");
  Timeline::get(group->rank());
  // A group of its own: the coordinator's thread issues collectives while the caller may issue
  // others on `group`.
  std::vector<int> ranks(static_cast<size_t>(group->size()));
  std::iota(ranks.begin(), ranks.end(), 0);
  auto own = group->new_group(ranks);
  if (options.timeout.count() == 0) options.timeout = own->timeout();

  CoordinatorOptions co;
  co.fusion_threshold_bytes = options.fusion_threshold_bytes;
  co.cycle_time = options.cycle_time;
  co.stall_timeout = options.stall_timeout;
  co.cache_capacity = options.cache_capacity;
  co.timeout = options.timeout;
  coordinator_ = std::make_shared<Coordinator>(own, co);

  GradientHooksOptions ho;
  ho.backward_passes_per_step = options.backward_passes_per_step;
  ho.compression = options.compression;
  ho.op = options.op;
  ho.wait_limit = options.stall_timeout + options.timeout;
  hooks_ =
      std::make_unique<GradientHooks>(coordinator_, std::move(named_parameters), ho, group->rank());
}

DistributedOptimizer::~DistributedOptimizer() {
  hooks_.reset();
  coordinator_.reset();
}

void DistributedOptimizer::synchronize() { hooks_->synchronize(); }

void DistributedOptimizer::step() {
  synchronize();
  optimizer_->step();
}

void DistributedOptimizer::zero_grad() { optimizer_->zero_grad(); }

}  // namespace dtrain
