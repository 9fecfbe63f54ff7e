// GradientHooks: post hooks on gradient accumulators that submit to the Coordinator, and the wait
// that finishes each gradient (decompression, scaling).
#include "torch/gradient_hooks.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "dtrain/error.h"
#include "dtrain/timeline.h"
#include "dtrain/torch/tensor_view.h"
#include "horovod/coordinator.h"
#include "torch/autograd_node.h"

namespace dtrain {

struct GradientHooks::Slot {
  std::string name;
  at::Tensor param;
  AutogradNodePtr accumulator;
  uintptr_t hook_key = 0;
  int passes = 0;  // backward passes since the last synchronize
  std::shared_ptr<Coordinator::Handle> handle;
  at::Tensor compressed;  // fp16 copy on the wire
  at::Tensor dense;       // a sparse gradient, reduced whole (Horovod's sparse_as_dense)
};

GradientHooks::GradientHooks(std::shared_ptr<Coordinator> coordinator,
                             std::vector<std::pair<std::string, at::Tensor>> named_parameters,
                             GradientHooksOptions options, int rank)
    : coordinator_(std::move(coordinator)), options_(options), rank_(rank) {
  set_backward_passes_per_step(options_.backward_passes_per_step);
  for (auto& [name, param] : named_parameters) {
    if (!param.requires_grad()) continue;
    for (const auto& s : slots_)
      if (s->name == name)
        throw InvalidArgumentError(fmt::format(
            "rank {}: DistributedOptimizer: two parameters are both named '{}'; names identify "
            "gradients across ranks and must be unique",
            rank_, name));
    auto slot = std::make_unique<Slot>();
    slot->name = name;
    slot->param = param;
    slot->accumulator = torch::autograd::impl::grad_accumulator(param);
    if (slot->accumulator == nullptr)
      throw InvalidArgumentError(fmt::format(
          "rank {}: DistributedOptimizer: parameter '{}' is not a leaf tensor; pass the model's "
          "parameters",
          rank_, name));
    const size_t index = slots_.size();
    slot->hook_key =
        slot->accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [this, index](const torch::autograd::variable_list& outputs,
                          const torch::autograd::variable_list&) {
              on_grad_ready(index);
              return outputs;
            }));
    slots_.push_back(std::move(slot));
  }
}

GradientHooks::~GradientHooks() {
  for (auto& s : slots_) s->accumulator->del_post_hook(s->hook_key);
}

void GradientHooks::set_backward_passes_per_step(int passes) {
  if (passes < 1)
    throw InvalidArgumentError(fmt::format(
        "DistributedOptimizer: backward_passes_per_step is {}; it must be at least 1", passes));
  options_.backward_passes_per_step = passes;
}

void GradientHooks::on_grad_ready(size_t index) {
  Slot& s = *slots_[index];
  if (s.handle != nullptr)
    throw InvalidArgumentError(fmt::format(
        "rank {}: DistributedOptimizer: parameter '{}' got a gradient after its all-reduce was "
        "queued: more than backward_passes_per_step={} backward passes before step()",
        rank_, s.name, options_.backward_passes_per_step));
  if (++s.passes == options_.backward_passes_per_step) submit(index);
}

void GradientHooks::submit(size_t index) {
  Slot& s = *slots_[index];
  at::Tensor& grad = s.param.mutable_grad();
  if (!grad.defined()) {
    grad = at::zeros_like(s.param, at::MemoryFormat::Contiguous);  // unused here: reduce zeros
  } else if (grad.is_sparse()) {
    // An embedding's rows: reduced as a dense tensor, handed back sparse by finish(). (Horovod
    // gathers the rows instead unless sparse_as_dense; the sum is the same.)
    s.dense = grad.to_dense().contiguous();
  } else if (!grad.is_contiguous()) {
    grad = grad.contiguous();
  }
  at::Tensor& reduced = s.dense.defined() ? s.dense : grad;
  if (options_.prescale != 1.0) reduced.mul_(options_.prescale);
  TensorView view;
  if (options_.compression == Compression::kFp16 && reduced.is_floating_point() &&
      reduced.scalar_type() != at::kHalf) {
    s.compressed = reduced.to(at::kHalf);
    view = dtrain::view_of(s.compressed);
  } else {
    s.compressed = at::Tensor();
    view = dtrain::view_of(reduced);
  }
  s.handle = coordinator_->submit(s.name, view, options_.op);
}

void GradientHooks::submit_missing() {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i]->handle == nullptr) submit(i);
  waited_ = 0;
  submitted_at_ = std::chrono::steady_clock::now();
}

void GradientHooks::finish(Slot& s) {
  at::Tensor& reduced = s.dense.defined() ? s.dense : s.param.mutable_grad();
  if (s.compressed.defined()) reduced.copy_(s.compressed);
  if (options_.postscale != 1.0) reduced.mul_(options_.postscale);
  if (s.dense.defined()) s.param.mutable_grad() = s.dense.to_sparse();
  s.handle = nullptr;
  s.compressed = at::Tensor();
  s.dense = at::Tensor();
  s.passes = 0;
}

bool GradientHooks::wait_some(std::chrono::milliseconds slice) {
  const auto until = std::chrono::steady_clock::now() + slice;
  for (; waited_ < slots_.size(); ++waited_) {
    Slot& s = *slots_[waited_];
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (!s.handle->wait_for(std::max(left, std::chrono::milliseconds(0)))) {
      if (std::chrono::steady_clock::now() - submitted_at_ > options_.wait_limit)
        s.handle->wait(std::chrono::milliseconds(0));  // throws the TimeoutError naming it
      return false;
    }
    finish(s);
  }
  if (Timeline* t = Timeline::get())
    t->add("synchronize gradients", "comm", submitted_at_, std::chrono::steady_clock::now());
  return true;
}

void GradientHooks::synchronize() {
  TimelineSpan span("synchronize gradients", "comm");
  submit_missing();
  for (auto& s : slots_) {
    s->handle->wait(options_.wait_limit);
    finish(*s);
  }
  waited_ = slots_.size();
}

bool GradientHooks::pending() const {
  for (const auto& s : slots_)
    if (s->handle != nullptr) return true;
  return false;
}

}  // namespace dtrain
