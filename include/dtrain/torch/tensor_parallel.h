// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): one layer's weights cut across the
// ranks of a tensor-parallel group, each rank computing its share of every sample.
//
//   auto world = dtrain::init_process_group();                       // 4 ranks
//   dtrain::ParallelLayout layout(world, {.tensor_parallel = 2});    // 2 (tensor) x 2 (data)
//   torch::manual_seed(0);                                           // the same on every rank
//   dtrain::ParallelMLP mlp(512, 2048, layout.tensor_group());       // half of each layer each
//   dtrain::DistributedDataParallel ddp(mlp.ptr(), layout.data_group());   // replicas average
//   auto y = ddp.forward([&] { return mlp->forward(x); });           // x: the whole input
//
// ColumnParallelLinear: Y = X A with A's output features cut N ways; each rank computes its
//   columns of Y (gather_output = true all-gathers them into the whole Y). Backward all-reduces
//   the gradient of X (each rank's share of it).
// RowParallelLinear: Y = X A with A's input features cut N ways; each rank takes its columns of
//   X (input_is_parallel = true: X already is that, e.g. a ColumnParallelLinear's output) and
//   the partial products are all-reduced; the bias is added once, after.
// ParallelMLP: Column(h -> f), GELU, Row(f -> h): one all-reduce in forward, one in backward.
// ParallelSelfAttention: the heads cut N ways: a Column projection to each rank's heads' queries,
//   keys and values, attention per head, a Row projection back: one all-reduce each way.
//
// Initialisation: each layer draws the whole weight as torch::nn::Linear(in, out) would from the
// same random state, then keeps its part; so with the same seed on every rank the model equals
// its serial twin (the tests compare them), and the layers are built in the serial order. The
// collectives run on the tensor-parallel group, in call order: every rank of the group runs the
// same layers on inputs of the same shape. CPU tensors.
#pragma once

#include <memory>

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "dtrain/process_group.h"

namespace dtrain {

// The Megatron operators, as autograd functions on `group`:
// f: identity forward, all-reduce (sum) of the gradient in backward.
at::Tensor copy_to_tensor_parallel(const at::Tensor& x, const std::shared_ptr<ProcessGroup>& group);
// g: all-reduce (sum) forward, identity backward.
at::Tensor reduce_from_tensor_parallel(const at::Tensor& x,
                                       const std::shared_ptr<ProcessGroup>& group);
// All-gather along the last dimension forward; this rank's slice of the gradient backward.
at::Tensor gather_from_tensor_parallel(const at::Tensor& x,
                                       const std::shared_ptr<ProcessGroup>& group);
// This rank's slice of the last dimension forward; all-gather of the gradient backward.
at::Tensor scatter_to_tensor_parallel(const at::Tensor& x,
                                      const std::shared_ptr<ProcessGroup>& group);

struct ColumnParallelLinearOptions {
  bool bias = true;
  bool gather_output = false;  // true: every rank gets the whole output
};

class ColumnParallelLinearImpl : public torch::nn::Cloneable<ColumnParallelLinearImpl> {
 public:
  // out_features must be a multiple of the group's size (InvalidArgumentError otherwise).
  ColumnParallelLinearImpl(int64_t in_features, int64_t out_features,
                           std::shared_ptr<ProcessGroup> group,
                           ColumnParallelLinearOptions options = {});
  // From a whole weight [out, in] and bias [out] (or undefined): this rank keeps `rows` of them
  // (default: its contiguous block of out / N).
  ColumnParallelLinearImpl(const at::Tensor& weight, const at::Tensor& bias,
                           std::shared_ptr<ProcessGroup> group,
                           ColumnParallelLinearOptions options = {}, at::Tensor rows = {});
  void reset() override {}
  at::Tensor forward(const at::Tensor& input);

  at::Tensor weight;  // [out / N, in]
  at::Tensor bias;    // [out / N]
 private:
  std::shared_ptr<ProcessGroup> group_;
  ColumnParallelLinearOptions options_;
};
TORCH_MODULE(ColumnParallelLinear);

struct RowParallelLinearOptions {
  bool bias = true;
  bool input_is_parallel = true;  // false: the whole input comes in and each rank takes its part
};

class RowParallelLinearImpl : public torch::nn::Cloneable<RowParallelLinearImpl> {
 public:
  // in_features must be a multiple of the group's size.
  RowParallelLinearImpl(int64_t in_features, int64_t out_features,
                        std::shared_ptr<ProcessGroup> group, RowParallelLinearOptions options = {});
  void reset() override {}
  at::Tensor forward(const at::Tensor& input);

  at::Tensor weight;  // [out, in / N]
  at::Tensor bias;    // [out], the same on every rank
 private:
  std::shared_ptr<ProcessGroup> group_;
  RowParallelLinearOptions options_;
};
TORCH_MODULE(RowParallelLinear);

class ParallelMLPImpl : public torch::nn::Cloneable<ParallelMLPImpl> {
 public:
  // Linear(hidden, ffn), GELU, Linear(ffn, hidden), cut: ffn must be a multiple of N.
  ParallelMLPImpl(int64_t hidden, int64_t ffn, std::shared_ptr<ProcessGroup> group);
  void reset() override {}
  at::Tensor forward(const at::Tensor& x);  // [..., hidden] -> [..., hidden], whole on every rank

  ColumnParallelLinear fc1{nullptr};
  RowParallelLinear fc2{nullptr};
};
TORCH_MODULE(ParallelMLP);

class ParallelSelfAttentionImpl : public torch::nn::Cloneable<ParallelSelfAttentionImpl> {
 public:
  // Multi-head self-attention as Linear(hidden, 3 hidden) -> q, k, v (in that order, each
  // [heads x head_dim]), softmax(q k^T / sqrt(head_dim)) v per head, Linear(hidden, hidden);
  // heads must be a multiple of N. causal: each position attends to itself and the ones before.
  ParallelSelfAttentionImpl(int64_t hidden, int64_t heads, std::shared_ptr<ProcessGroup> group,
                            bool causal = false);
  void reset() override {}
  at::Tensor forward(const at::Tensor& x);  // [batch, sequence, hidden], whole on every rank

  ColumnParallelLinear qkv{nullptr};
  RowParallelLinear out{nullptr};

 private:
  int64_t heads_ = 0, local_heads_ = 0, head_dim_ = 0;
  bool causal_ = false;
};
TORCH_MODULE(ParallelSelfAttention);

}  // namespace dtrain
