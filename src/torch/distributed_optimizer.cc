// DistributedOptimizer: gradient hooks that hand each ready gradient to the Coordinator, and a
// step() that waits for the averages.
#include "dtrain/torch/distributed_optimizer.h"

#include <numeric>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "dtrain/error.h"
#include "dtrain/torch/timeline.h"
#include "torch/coordinator.h"
#include "torch/tensor_view.h"

namespace dtrain {

struct DistributedOptimizer::Slot {
  std::string name;
  at::Tensor param;
  std::shared_ptr<torch::autograd::Node> accumulator;
  uintptr_t hook_key = 0;
  int passes = 0;  // backward passes since the last step
  std::shared_ptr<Coordinator::Handle> handle;
  at::Tensor compressed;  // fp16 copy on the wire
};

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
    : optimizer_(std::move(optimizer)), options_(options) {
  if (optimizer_ == nullptr || group == nullptr)
    throw InvalidArgumentError("DistributedOptimizer: optimizer and process group must be set");
  if (options_.backward_passes_per_step < 1)
    throw InvalidArgumentError(fmt::format(
        "DistributedOptimizer: backward_passes_per_step is {}; it must be at least 1",
        options_.backward_passes_per_step));
  Timeline::get(group->rank());
  // A group of its own: the coordinator's thread issues collectives while the caller may issue
  // others on `group`.
  std::vector<int> ranks(static_cast<size_t>(group->size()));
  std::iota(ranks.begin(), ranks.end(), 0);
  group_ = group->new_group(ranks);
  if (options_.timeout.count() == 0) options_.timeout = group_->timeout();

  CoordinatorOptions co;
  co.op = ReduceOp::kAvg;
  co.fusion_threshold_bytes = options_.fusion_threshold_bytes;
  co.cycle_time = options_.cycle_time;
  co.stall_timeout = options_.stall_timeout;
  co.cache_capacity = options_.cache_capacity;
  co.timeout = options_.timeout;
  coordinator_ = std::make_unique<Coordinator>(group_, co);

  for (auto& [name, param] : named_parameters) {
    if (!param.requires_grad()) continue;
    auto slot = std::make_unique<Slot>();
    slot->name = name;
    slot->param = param;
    slot->accumulator = torch::autograd::impl::grad_accumulator(param);
    const size_t index = slots_.size();
    slot->hook_key = slot->accumulator->add_post_hook(
        std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [this, index](const torch::autograd::variable_list& outputs,
                          const torch::autograd::variable_list&) {
              on_grad_ready(index);
              return outputs;
            }));
    slots_.push_back(std::move(slot));
  }
}

DistributedOptimizer::~DistributedOptimizer() {
  for (auto& s : slots_) s->accumulator->del_post_hook(s->hook_key);
  coordinator_.reset();
}

void DistributedOptimizer::on_grad_ready(size_t index) {
  Slot& s = *slots_[index];
  if (s.handle != nullptr)
    throw InvalidArgumentError(fmt::format(
        "rank {}: DistributedOptimizer: parameter '{}' got a gradient after its all-reduce was "
        "queued: more than backward_passes_per_step={} backward passes before step()",
        group_->rank(), s.name, options_.backward_passes_per_step));
  if (++s.passes == options_.backward_passes_per_step) submit(index);
}

void DistributedOptimizer::submit(size_t index) {
  Slot& s = *slots_[index];
  at::Tensor& grad = s.param.mutable_grad();
  if (!grad.defined()) {
    grad = at::zeros_like(s.param, at::MemoryFormat::Contiguous);  // unused here: reduce zeros
  } else if (!grad.is_contiguous()) {
    grad = grad.contiguous();
  }
  TensorView view;
  if (options_.compression == Compression::kFp16 && grad.is_floating_point() &&
      grad.scalar_type() != at::kHalf) {
    s.compressed = grad.to(at::kHalf);
    view = torch_detail::view_of(s.compressed);
  } else {
    s.compressed = at::Tensor();
    view = torch_detail::view_of(grad);
  }
  s.handle = coordinator_->submit(s.name, view);
}

void DistributedOptimizer::synchronize() {
  TimelineSpan span("synchronize gradients", "comm");
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i]->handle == nullptr) submit(i);
  const auto limit = options_.stall_timeout + options_.timeout;
  for (auto& s : slots_) {
    s->handle->wait(std::chrono::duration_cast<std::chrono::milliseconds>(limit));
    if (s->compressed.defined()) s->param.mutable_grad().copy_(s->compressed);
    s->handle = nullptr;
    s->passes = 0;
  }
}

void DistributedOptimizer::step() {
  synchronize();
  optimizer_->step();
}

void DistributedOptimizer::zero_grad() { optimizer_->zero_grad(); }

}  // namespace dtrain
