// Tensor-parallel layers: the Megatron operators as autograd functions, and the layers built on
// them (dtrain/torch/tensor_parallel.h).
#include "dtrain/torch/tensor_parallel.h"

#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/nn/modules/linear.h>

#include "dtrain/error.h"
#include "dtrain/torch/tensor_view.h"

namespace dtrain {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group travels through autograd as an integer: the layer that holds the shared_ptr
// outlives its graph (a graph is freed by its backward, before the layer could be).
int64_t handle(const std::shared_ptr<ProcessGroup>& group) {
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(group.get()));
}
ProcessGroup& group_of(AutogradContext* ctx) {
  return *reinterpret_cast<ProcessGroup*>(static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
}

// Sums `t` (contiguous, owned by the caller) over the group, in place, on this thread.
void allreduce_in_place(ProcessGroup& group, const at::Tensor& t) {
  AllreduceOptions o;
  o.async_op = false;
  group.allreduce(view_of(t), o)->wait();
}

// Every rank's `x` side by side along the last dimension, in rank order.
at::Tensor all_gather_last(ProcessGroup& group, const at::Tensor& x) {
  at::Tensor in = x.contiguous();
  const int n = group.size();
  std::vector<int64_t> shape = {n};
  for (int64_t d : in.sizes()) shape.push_back(d);
  at::Tensor out = at::empty(shape, in.options());
  AllgatherOptions o;
  o.async_op = false;
  group.allgather(view_of(out), view_of(in), o)->wait();
  return at::cat(out.unbind(0), -1);
}

at::Tensor own_slice_last(ProcessGroup& group, const at::Tensor& x) {
  const int64_t last = x.size(-1);
  if (last % group.size() != 0)
    throw InvalidArgumentError(fmt::format(
        "rank {}: tensor parallel: the last dimension ({}) is not a multiple of the {} ranks of "
        "the group",
        group.rank(), last, group.size()));
  return x.chunk(group.size(), -1)[static_cast<size_t>(group.rank())].contiguous();
}

struct CopyToParallel : torch::autograd::Function<CopyToParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor g = grads[0].clone(at::MemoryFormat::Contiguous);
    allreduce_in_place(group_of(ctx), g);
    return {g, at::Tensor()};
  }
};

struct ReduceFromParallel : torch::autograd::Function<ReduceFromParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    at::Tensor out = x.clone(at::MemoryFormat::Contiguous);
    allreduce_in_place(group_of(ctx), out);
    return out;
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

struct GatherFromParallel : torch::autograd::Function<GatherFromParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return all_gather_last(group_of(ctx), x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {own_slice_last(group_of(ctx), grads[0]), at::Tensor()};
  }
};

struct ScatterToParallel : torch::autograd::Function<ScatterToParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return own_slice_last(group_of(ctx), x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_gather_last(group_of(ctx), grads[0]), at::Tensor()};
  }
};

void check_divides(int64_t features, const char* what, const ProcessGroup& group,
                   const char* layer) {
  if (features % group.size() != 0)
    throw InvalidArgumentError(fmt::format(
        "rank {}: {}: {} {} is not a multiple of the {} ranks of the tensor-parallel group; "
        "choose sizes that the group divides",
        group.rank(), layer, what, features, group.size()));
}

std::shared_ptr<ProcessGroup> checked(std::shared_ptr<ProcessGroup> group, const char* layer) {
  if (group == nullptr)
    throw InvalidArgumentError(fmt::format("{}: the tensor-parallel group is null", layer));
  return group;
}

}  // namespace

at::Tensor copy_to_tensor_parallel(const at::Tensor& x,
                                   const std::shared_ptr<ProcessGroup>& group) {
  return CopyToParallel::apply(x, handle(group));
}
at::Tensor reduce_from_tensor_parallel(const at::Tensor& x,
                                       const std::shared_ptr<ProcessGroup>& group) {
  return ReduceFromParallel::apply(x, handle(group));
}
at::Tensor gather_from_tensor_parallel(const at::Tensor& x,
                                       const std::shared_ptr<ProcessGroup>& group) {
  return GatherFromParallel::apply(x, handle(group));
}
at::Tensor scatter_to_tensor_parallel(const at::Tensor& x,
                                      const std::shared_ptr<ProcessGroup>& group) {
  return ScatterToParallel::apply(x, handle(group));
}

// ---------------------------------------------------------------------------------------------

ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in_features, int64_t out_features,
                                                   std::shared_ptr<ProcessGroup> group,
                                                   ColumnParallelLinearOptions options)
    : group_(checked(std::move(group), "ColumnParallelLinear")), options_(options) {
  check_divides(out_features, "out_features", *group_, "ColumnParallelLinear");
  torch::nn::Linear whole(torch::nn::LinearOptions(in_features, out_features).bias(options.bias));
  const int64_t part = out_features / group_->size();
  torch::NoGradGuard no_grad;
  weight =
      register_parameter("weight", whole->weight.narrow(0, group_->rank() * part, part).clone());
  if (options.bias)
    bias = register_parameter("bias", whole->bias.narrow(0, group_->rank() * part, part).clone());
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const at::Tensor& whole_weight,
                                                   const at::Tensor& whole_bias,
                                                   std::shared_ptr<ProcessGroup> group,
                                                   ColumnParallelLinearOptions options,
                                                   at::Tensor rows)
    : group_(checked(std::move(group), "ColumnParallelLinear")), options_(options) {
  const int64_t out_features = whole_weight.size(0);
  check_divides(out_features, "out_features", *group_, "ColumnParallelLinear");
  const int64_t part = out_features / group_->size();
  if (!rows.defined()) rows = at::arange(group_->rank() * part, (group_->rank() + 1) * part);
  torch::NoGradGuard no_grad;
  weight = register_parameter("weight", whole_weight.index_select(0, rows).clone());
  options_.bias = whole_bias.defined();
  if (options_.bias) bias = register_parameter("bias", whole_bias.index_select(0, rows).clone());
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& input) {
  at::Tensor y = at::linear(copy_to_tensor_parallel(input, group_), weight,
                            options_.bias ? bias : at::Tensor());
  return options_.gather_output ? gather_from_tensor_parallel(y, group_) : y;
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in_features, int64_t out_features,
                                             std::shared_ptr<ProcessGroup> group,
                                             RowParallelLinearOptions options)
    : group_(checked(std::move(group), "RowParallelLinear")), options_(options) {
  check_divides(in_features, "in_features", *group_, "RowParallelLinear");
  torch::nn::Linear whole(torch::nn::LinearOptions(in_features, out_features).bias(options.bias));
  const int64_t part = in_features / group_->size();
  torch::NoGradGuard no_grad;
  weight =
      register_parameter("weight", whole->weight.narrow(1, group_->rank() * part, part).clone());
  if (options.bias) bias = register_parameter("bias", whole->bias.clone());
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& input) {
  at::Tensor x = options_.input_is_parallel ? input : scatter_to_tensor_parallel(input, group_);
  at::Tensor y = reduce_from_tensor_parallel(at::linear(x, weight), group_);
  return options_.bias ? y + bias : y;
}

ParallelMLPImpl::ParallelMLPImpl(int64_t hidden, int64_t ffn, std::shared_ptr<ProcessGroup> group) {
  fc1 = register_module("fc1", ColumnParallelLinear(hidden, ffn, group));
  fc2 = register_module("fc2", RowParallelLinear(ffn, hidden, group));
}

at::Tensor ParallelMLPImpl::forward(const at::Tensor& x) {
  return fc2->forward(at::gelu(fc1->forward(x)));
}

ParallelSelfAttentionImpl::ParallelSelfAttentionImpl(int64_t hidden, int64_t heads,
                                                     std::shared_ptr<ProcessGroup> group,
                                                     bool causal)
    : heads_(heads), causal_(causal) {
  group = checked(std::move(group), "ParallelSelfAttention");
  if (heads <= 0 || hidden % heads != 0)
    throw InvalidArgumentError(
        fmt::format("rank {}: ParallelSelfAttention: hidden {} is not a multiple of heads {}",
                    group->rank(), hidden, heads));
  check_divides(heads, "heads", *group, "ParallelSelfAttention");
  head_dim_ = hidden / heads;
  local_heads_ = heads / group->size();
  // The whole projection as Linear(hidden, 3 hidden) draws it; this rank keeps the rows of its
  // heads in each of q, k and v.
  torch::nn::Linear whole(hidden, 3 * hidden);
  const int64_t width = local_heads_ * head_dim_, first = group->rank() * width;
  at::Tensor rows =
      at::cat({at::arange(first, first + width), at::arange(hidden + first, hidden + first + width),
               at::arange(2 * hidden + first, 2 * hidden + first + width)});
  qkv = register_module("qkv", ColumnParallelLinear(whole->weight, whole->bias, group,
                                                    ColumnParallelLinearOptions{}, rows));
  out = register_module("out", RowParallelLinear(hidden, hidden, group));
}

at::Tensor ParallelSelfAttentionImpl::forward(const at::Tensor& x) {
  const int64_t batch = x.size(0), length = x.size(1);
  auto parts = qkv->forward(x).chunk(3, -1);
  auto heads = [&](const at::Tensor& t) {
    return t.reshape({batch, length, local_heads_, head_dim_}).transpose(1, 2);
  };
  at::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  at::Tensor scores =
      at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
  if (causal_) {
    at::Tensor future = at::ones({length, length}, at::kBool).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  }
  at::Tensor context = at::matmul(at::softmax(scores, -1), v)
                           .transpose(1, 2)
                           .reshape({batch, length, local_heads_ * head_dim_});
  return out->forward(context);
}

}  // namespace dtrain
