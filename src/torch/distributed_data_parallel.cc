// DistributedDataParallel: model checks and broadcasts, the forward wrapper, no_sync and join
// around the Reducer.
#include "dtrain/torch/distributed_data_parallel.h"

#include <functional>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>

#include "dtrain/error.h"
#include "dtrain/timeline.h"
#include "dtrain/torch/broadcast.h"
#include "dtrain/torch/tensor_view.h"
#include "torch/reducer.h"

namespace dtrain {

// What an active rank does in one forward, summed over the active ranks inside join().
struct DistributedDataParallel::JoinFlags {
  int64_t active = 0;
  int64_t rebuild = 0;
  int64_t buffers = 0;
  int64_t grad_sync = 0;
};

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 DdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(std::move(options)) {
  if (module_ == nullptr || group_ == nullptr)
    throw InvalidArgumentError("DistributedDataParallel: module and process group must be set");
  if (options_.comm_hook == nullptr) options_.comm_hook = allreduce_hook();
  Timeline::get(group_->rank());
  check_same_model();
  broadcast_state(0);

  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  for (const auto& p : module_->named_parameters(/*recurse=*/true)) {
    if (!p.value().requires_grad()) continue;
    names.push_back(p.key());
    params.push_back(p.value());
  }
  ReducerOptions ro;
  ro.first_bucket_cap_bytes = options_.first_bucket_cap_bytes;
  ro.bucket_cap_bytes = options_.bucket_cap_bytes;
  ro.find_unused_parameters = options_.find_unused_parameters;
  ro.rebuild_buckets = options_.rebuild_buckets;
  ro.gradient_as_bucket_view = options_.gradient_as_bucket_view;
  ro.timeout = options_.timeout;
  reducer_ = std::make_unique<Reducer>(std::move(names), std::move(params), group_,
                                       options_.comm_hook, ro);
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::check_same_model() {
  // A fingerprint of every parameter's and buffer's name, shape and dtype, compared everywhere.
  std::string description;
  int64_t count = 0;
  for (const auto& p : module_->named_parameters(true)) {
    description += fmt::format("{}:{}:{};", p.key(), p.value().sizes().vec(),
                               c10::toString(p.value().scalar_type()));
    ++count;
  }
  for (const auto& b : module_->named_buffers(true))
    description += fmt::format("{}:{}:{};", b.key(), b.value().sizes().vec(),
                               c10::toString(b.value().scalar_type()));
  std::vector<int64_t> mine = {count, static_cast<int64_t>(std::hash<std::string>{}(description))};
  std::vector<int64_t> all(2 * static_cast<size_t>(group_->size()));
  AllgatherOptions o;
  o.timeout = options_.timeout;
  group_->allgather(TensorView::of(all), TensorView::of(mine), o)->wait();
  std::vector<int> differ;
  for (int r = 0; r < group_->size(); ++r)
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) differ.push_back(r);
  if (!differ.empty())
    throw InvalidArgumentError(fmt::format(
        "rank {}: DistributedDataParallel: ranks [{}] have a model that differs from rank 0's "
        "(parameter counts by rank: [{}]; names, shapes or dtypes differ); every rank must "
        "build the same model",
        group_->rank(), fmt::join(differ, ", "),
        fmt::join(std::vector<int64_t>([&] {
                    std::vector<int64_t> c;
                    for (int r = 0; r < group_->size(); ++r) c.push_back(all[2 * r]);
                    return c;
                  }()),
                  ", ")));
}

void DistributedDataParallel::broadcast_state(int root) {
  broadcast_parameters(*module_, *group_, root, options_.timeout);
}

void DistributedDataParallel::broadcast_buffers(int root) {
  std::vector<at::Tensor> tensors;
  for (const auto& b : module_->named_buffers(true)) tensors.push_back(b.value());
  broadcast_tensors(*group_, tensors, root, options_.timeout);
}

void DistributedDataParallel::pre_forward() {
  reducer_->prepare_for_forward();
  const bool grad = at::GradMode::is_enabled();
  const bool buffers = options_.broadcast_buffers && grad && group_->size() > 1;
  if (joining_) {
    JoinFlags f{1, reducer_->rebuild_pending() ? 1 : 0, buffers ? 1 : 0, (grad && sync_) ? 1 : 0};
    std::vector<int64_t> v = {f.active, f.rebuild, f.buffers, f.grad_sync};
    AllreduceOptions o;
    o.timeout = options_.timeout;
    group_->allreduce(TensorView::of(v), o)->wait();
    ++join_iterations_;
  }
  if (reducer_->rebuild_pending()) reducer_->rebuild_buckets();
  if (buffers) {
    TimelineSpan span("broadcast buffers", "comm");
    broadcast_buffers(0);
  }
  forward_start_ = std::chrono::steady_clock::now();
}

void DistributedDataParallel::post_forward(const at::Tensor& output) {
  post_forward(std::vector<at::Tensor>{output});
}

void DistributedDataParallel::post_forward(const std::vector<at::Tensor>& outputs) {
  if (Timeline* t = Timeline::get())
    t->add("forward", "compute", forward_start_, std::chrono::steady_clock::now());
  if (at::GradMode::is_enabled() && sync_) {
    reducer_->prepare_for_backward(outputs);
  } else {
    reducer_->prepare_for_local_backward();
  }
}

void DistributedDataParallel::shadow_until_all_joined() {
  for (;;) {
    std::vector<int64_t> v = {0, 0, 0, 0};
    AllreduceOptions o;
    o.timeout = options_.timeout;
    group_->allreduce(TensorView::of(v), o)->wait();
    JoinFlags f{v[0], v[1], v[2], v[3]};
    if (f.active == 0) return;
    if (f.rebuild > 0) reducer_->rebuild_buckets();
    if (f.buffers > 0) broadcast_buffers(0);
    if (f.grad_sync > 0) reducer_->shadow_backward();
  }
}

void DistributedDataParallel::join(const std::function<void()>& body) {
  joining_ = true;
  join_iterations_ = 0;
  try {
    body();
  } catch (...) {
    joining_ = false;
    throw;
  }
  joining_ = false;
  reducer_->prepare_for_forward();  // a trailing forward without backward is fine here
  shadow_until_all_joined();
  // Everyone joined: take the model of the rank that ran the most iterations (lowest rank on a
  // tie), since the ranks that joined early stopped stepping.
  const int64_t size = group_->size();
  std::vector<int64_t> key = {join_iterations_ * size + (size - 1 - group_->rank())};
  AllreduceOptions o;
  o.op = ReduceOp::kMax;
  o.timeout = options_.timeout;
  group_->allreduce(TensorView::of(key), o)->wait();
  const int root = static_cast<int>(size - 1 - key[0] % size);
  broadcast_state(root);
}

void DistributedDataParallel::set_comm_hook(std::shared_ptr<CommHook> hook) {
  options_.comm_hook = hook ? std::move(hook) : allreduce_hook();
  reducer_->set_comm_hook(options_.comm_hook);
}

std::vector<std::vector<std::string>> DistributedDataParallel::buckets() const {
  return reducer_->bucket_names();
}

}  // namespace dtrain
