// Reducer: buckets of gradients, filled by autograd hooks and all-reduced as they fill.
//
// Cost per iteration: one copy of every gradient into its bucket and one back, plus one
// collective per bucket (two with find_unused_parameters: the map of used parameters). With
// gradient_as_bucket_view, .grad is left a view of its bucket instead of copied back, and a
// .grad that still is one (zero_grad without set_to_none) is accumulated in place: no copy. Buckets
// start strictly in index order, so every rank issues the same collectives in the same order
// whatever order its hooks fire in.
#include "torch/reducer.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "dtrain/error.h"
#include "dtrain/timeline.h"
#include "dtrain/torch/tensor_view.h"

namespace dtrain {

using Clock = std::chrono::steady_clock;

struct Reducer::Bucket {
  GradBucket grad;
  std::vector<size_t> params;
  std::vector<int64_t> offsets;  // element offset of each parameter in grad.buffer
  size_t pending = 0;            // parameters not yet ready this backward
  bool launched = false;
  std::shared_ptr<Work> work;
  Clock::time_point launched_at{};
  bool end_recorded = false;
};

Reducer::Reducer(std::vector<std::string> names, std::vector<at::Tensor> params,
                 std::shared_ptr<ProcessGroup> group, std::shared_ptr<CommHook> hook,
                 ReducerOptions options)
    : names_(std::move(names)),
      params_(std::move(params)),
      group_(std::move(group)),
      hook_(std::move(hook)),
      options_(options) {
  const size_t n = params_.size();
  ready_.assign(n, 0);
  used_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    auto key = acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs,
                  const torch::autograd::variable_list&) {
          on_grad_ready(i);
          return outputs;
        }));
    accumulators_.push_back(std::move(acc));
    hook_keys_.push_back(key);
  }
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = n - 1 - i;  // backward meets the last layer first
  build_buckets(order);
}

Reducer::~Reducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void Reducer::build_buckets(const std::vector<size_t>& order) {
  buckets_.clear();
  bucket_of_.assign(params_.size(), 0);
  slot_of_.assign(params_.size(), 0);
  std::unordered_map<int, size_t> open;    // dtype -> bucket being filled
  std::unordered_map<int, size_t> closed;  // dtype -> buckets filled so far
  std::vector<int64_t> sizes;
  for (size_t p : order) {
    const int type = static_cast<int>(params_[p].scalar_type());
    auto it = open.find(type);
    if (it == open.end()) {
      it = open.emplace(type, buckets_.size()).first;
      buckets_.push_back(std::make_unique<Bucket>());
      sizes.push_back(0);
    }
    const size_t b = it->second;
    Bucket& bucket = *buckets_[b];
    bucket_of_[p] = b;
    slot_of_[p] = bucket.params.size();
    bucket.params.push_back(p);
    bucket.offsets.push_back(sizes[b]);
    bucket.grad.parameter_names.push_back(names_[p]);
    sizes[b] += params_[p].numel();
    const size_t cap =
        closed[type] == 0 ? options_.first_bucket_cap_bytes : options_.bucket_cap_bytes;
    if (static_cast<size_t>(sizes[b]) * params_[p].element_size() >= cap) {
      open.erase(it);
      ++closed[type];
    }
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = *buckets_[b];
    bucket.grad.index = b;
    bucket.grad.buffer =
        at::zeros({sizes[b]}, params_[bucket.params[0]].options().requires_grad(false));
  }
}

std::vector<std::vector<std::string>> Reducer::bucket_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : buckets_) out.push_back(b->grad.parameter_names);
  return out;
}

void Reducer::prepare_for_forward() {
  if (!expect_hooks_) return;
  // The previous forward armed the hooks but no backward finished it.
  bool any_launched = next_to_launch_ > 0;
  if (!any_launched && !callback_queued_) {
    expect_hooks_ = false;  // a forward without backward: nothing was communicated
    return;
  }
  if (next_to_launch_ == buckets_.size() && !callback_queued_) {
    finalize_backward();  // every parameter was unused: no hook ran to finish the iteration
    return;
  }
  expect_hooks_ = false;
  throw InvalidArgumentError(
      fmt::format("rank {}: DDP: the previous iteration did not finish reducing gradients: {}",
                  group_->rank(), describe_missing()));
}

void Reducer::prepare_for_local_backward() { expect_hooks_ = false; }

void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs) {
  expect_hooks_ = true;
  callback_queued_ = false;
  next_to_launch_ = 0;
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(used_.begin(), used_.end(), 0);
  for (auto& b : buckets_) {
    b->pending = b->params.size();
    b->launched = false;
    b->work = nullptr;
    b->end_recorded = false;
  }
  backward_start_ = Clock::now();
  if (!options_.find_unused_parameters) return;

  // Walk the graph from the outputs; parameters whose accumulator is not reached get no
  // gradient this iteration, so they are ready now (with zeros).
  std::unordered_map<const torch::autograd::Node*, size_t> param_of;
  for (size_t i = 0; i < accumulators_.size(); ++i) param_of[accumulators_[i].get()] = i;
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  std::vector<uint8_t> reached(params_.size(), 0);
  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    if (auto fn = out.grad_fn()) {
      stack.push_back(fn.get());
    } else if (auto acc = torch::autograd::impl::try_get_grad_accumulator(out)) {
      stack.push_back(acc.get());
    }
  }
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    if (auto it = param_of.find(node); it != param_of.end()) reached[it->second] = 1;
    for (const auto& edge : node->next_edges())
      if (edge.function) stack.push_back(edge.function.get());
  }
  for (size_t p = 0; p < params_.size(); ++p)
    if (!reached[p]) mark_ready(p, /*used=*/false);
}

void Reducer::on_grad_ready(size_t p) {
  if (!expect_hooks_) return;
  if (!callback_queued_) {
    callback_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize_backward(); });
  }
  if (ready_[p])
    throw InvalidArgumentError(fmt::format(
        "rank {}: DDP: parameter '{}' received a gradient twice in one iteration (a second "
        "backward through the same forward, or a parameter marked unused that got a gradient); "
        "run one backward per forward, and use no_sync() to accumulate over several",
        group_->rank(), names_[p]));
  if (!rebuilt_) arrival_.push_back(p);
  used_[p] = 1;
  const at::Tensor& grad = params_[p].grad();
  at::Tensor into = slot(p);
  if (hook_->sums_divided_gradients()) {
    // A CPU double of no dimensions: the product keeps the gradient's dtype and device. (In
    // place when .grad is the slot: an elementwise product may write over its own input.)
    at::mul_out(into, grad,
                at::scalar_tensor(1.0 / static_cast<double>(group_->size()),
                                  at::TensorOptions().dtype(at::kDouble)));
  } else if (!grad_is_slot(p, into)) {
    into.copy_(grad);
  }
  mark_ready(p, /*used=*/true);

  if (Timeline* t = Timeline::get()) {  // stamp buckets that finished meanwhile
    for (size_t b = 0; b < next_to_launch_; ++b) {
      Bucket& launched = *buckets_[b];
      if (!launched.end_recorded && launched.work->is_completed()) {
        launched.end_recorded = true;
        t->add(fmt::format("allreduce bucket {}", b), "comm", launched.launched_at, Clock::now(),
               fmt::format(R"({{"bytes":{},"params":{}}})", launched.grad.buffer.nbytes(),
                           launched.params.size()));
      }
    }
  }
}

at::Tensor Reducer::slot(size_t p) const {
  const Bucket& bucket = *buckets_[bucket_of_[p]];
  return bucket.grad.buffer.narrow(0, bucket.offsets[slot_of_[p]], params_[p].numel())
      .view(params_[p].sizes());
}

bool Reducer::grad_is_slot(size_t p, const at::Tensor& slot) const {
  const at::Tensor& grad = params_[p].grad();
  return grad.defined() && grad.data_ptr() == slot.data_ptr() && grad.is_alias_of(slot);
}

void Reducer::mark_ready(size_t p, bool used) {
  ready_[p] = 1;
  Bucket& bucket = *buckets_[bucket_of_[p]];
  if (!used) {
    at::Tensor unused = slot(p);
    // Unused here: should no rank use it, it keeps its .grad (finalize_backward), which must
    // then not be the slot about to take zeros.
    if (grad_is_slot(p, unused)) params_[p].mutable_grad() = unused.clone();
    unused.zero_();
  }
  if (--bucket.pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_]->pending == 0) {
    Bucket& bucket = *buckets_[next_to_launch_];
    bucket.launched_at = Clock::now();
    bucket.work = hook_->start(*group_, bucket.grad, options_.timeout);
    bucket.launched = true;
    ++next_to_launch_;
  }
}

void Reducer::wait_bucket(Bucket& bucket) {
  bucket.work->wait();
  hook_->finish(bucket.grad);
  if (!bucket.end_recorded) {
    bucket.end_recorded = true;
    if (Timeline* t = Timeline::get())
      t->add(fmt::format("allreduce bucket {}", bucket.grad.index), "comm", bucket.launched_at,
             Clock::now(),
             fmt::format(R"({{"bytes":{},"params":{}}})", bucket.grad.buffer.nbytes(),
                         bucket.params.size()));
  }
}

std::string Reducer::describe_missing() const {
  std::vector<std::string> missing;
  for (size_t p = 0; p < params_.size(); ++p)
    if (!ready_[p]) missing.push_back(names_[p]);
  return fmt::format(
      "{} of {} parameters got no gradient ([{}]), so their buckets were never reduced; if "
      "forward does not use every parameter, construct DDP with find_unused_parameters = true; "
      "make sure the loss depends on the output DDP's forward returned",
      missing.size(), params_.size(), fmt::join(missing, ", "));
}

void Reducer::finalize_backward() {
  const auto backward_end = Clock::now();
  callback_queued_ = false;
  expect_hooks_ = false;
  if (next_to_launch_ < buckets_.size())
    throw InvalidArgumentError(
        fmt::format("rank {}: DDP: backward finished but {}", group_->rank(), describe_missing()));
  std::vector<int32_t> global_used;
  std::shared_ptr<Work> used_work;
  if (options_.find_unused_parameters) {
    global_used = used_;
    AllreduceOptions o;
    o.op = ReduceOp::kMax;
    o.timeout = options_.timeout;
    used_work = group_->allreduce(TensorView::of(global_used), o);
  }
  for (auto& b : buckets_) wait_bucket(*b);
  if (used_work) used_work->wait();

  c10::NoGradGuard no_grad;
  for (auto& b : buckets_) {
    for (size_t s = 0; s < b->params.size(); ++s) {
      const size_t p = b->params[s];
      // A parameter no rank used keeps its gradient as it was (PyTorch does the same).
      if (options_.find_unused_parameters && global_used[p] == 0) continue;
      const at::Tensor reduced = slot(p);
      at::Tensor& grad = params_[p].mutable_grad();
      if (options_.gradient_as_bucket_view) {
        // detach(): shares the memory without being an autograd view, which LibTorch's
        // Optimizer::zero_grad could not detach_() in place.
        if (!grad_is_slot(p, reduced)) grad = reduced.detach();
        continue;
      }
      if (!grad.defined()) grad = at::empty_like(params_[p], at::MemoryFormat::Contiguous);
      grad.copy_(reduced);
    }
  }
  if (!rebuilt_ && options_.rebuild_buckets) rebuild_pending_ = true;
  if (Timeline* t = Timeline::get()) {
    t->add("backward", "compute", backward_start_, backward_end);
    t->add("wait for buckets", "compute", backward_end, Clock::now());
  }
}

void Reducer::rebuild_buckets() {
  const size_t n = params_.size();
  std::vector<int64_t> order(n, -1);
  if (group_->rank() == 0 && !arrival_.empty()) {
    std::vector<uint8_t> placed(n, 0);
    size_t k = 0;
    for (size_t p : arrival_)
      if (!placed[p]) {
        placed[p] = 1;
        order[k++] = static_cast<int64_t>(p);
      }
    for (size_t i = n; i-- > 0;)  // parameters that got no gradient, last layer first
      if (!placed[i]) order[k++] = static_cast<int64_t>(i);
  }
  BroadcastOptions o;
  o.root = 0;
  o.timeout = options_.timeout;
  group_->broadcast(TensorView::of(order), o)->wait();
  rebuild_pending_ = false;
  rebuilt_ = true;
  arrival_.clear();
  if (n == 0 || order[0] < 0) return;  // rank 0 never saw a gradient: keep the buckets
  std::vector<size_t> layout(order.begin(), order.end());
  build_buckets(layout);
}

void Reducer::shadow_backward() {
  for (auto& b : buckets_) {
    b->grad.buffer.zero_();
    b->launched_at = Clock::now();
    b->end_recorded = true;
    b->work = hook_->start(*group_, b->grad, options_.timeout);
  }
  std::vector<int32_t> unused(params_.size(), 0);
  std::shared_ptr<Work> used_work;
  if (options_.find_unused_parameters) {
    AllreduceOptions o;
    o.op = ReduceOp::kMax;
    o.timeout = options_.timeout;
    used_work = group_->allreduce(TensorView::of(unused), o);
  }
  for (auto& b : buckets_) {
    b->work->wait();
    hook_->finish(b->grad);
  }
  if (used_work) used_work->wait();
}

}  // namespace dtrain
