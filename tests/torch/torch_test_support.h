// Shared by the torch tests: a small model with batch norm, deterministic data, comparisons.
// Everything runs inside forked ranks; the parent never touches LibTorch (a fork after LibTorch
// started its thread pools is not safe).
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "support/group.h"

namespace dtrain::testing {

// Linear -> BatchNorm1d -> ReLU -> Linear. With the batch norm in eval mode (running statistics
// fixed) the loss of a batch is the mean of per-sample losses, so the average of the ranks'
// gradients over B/N samples each equals one process's gradient over all B: the equality DDP
// promises. (In train mode each rank normalises with its own batch's statistics, which differ
// from the statistics of the whole batch, so there the equality does not hold.)
struct SmallNetImpl : torch::nn::Module {
  torch::nn::Linear fc1{8, 16};
  torch::nn::BatchNorm1d bn{16};
  torch::nn::Linear fc2{16, 4};
  SmallNetImpl() {
    register_module("fc1", fc1);
    register_module("bn", bn);
    register_module("fc2", fc2);
  }
  torch::Tensor forward(torch::Tensor x) {
    return fc2->forward(torch::relu(bn->forward(fc1->forward(x))));
  }
};
TORCH_MODULE(SmallNet);

// A module whose one parameter is on the meta device: a second device beside the CPU, standing
// for a GPU this machine may lack, for the refusals of models on two devices.
struct OnMetaImpl : torch::nn::Module {
  OnMetaImpl() { register_parameter("w", torch::zeros({6}, torch::Device(torch::kMeta))); }
  torch::Tensor forward(torch::Tensor x) { return x; }
};
TORCH_MODULE(OnMeta);

inline SmallNet make_net(bool bn_eval) {
  torch::manual_seed(1234);
  SmallNet net;
  {
    torch::NoGradGuard no_grad;  // non-trivial running statistics for eval mode
    net->bn->running_mean.uniform_(-0.5, 0.5);
    net->bn->running_var.uniform_(0.5, 1.5);
  }
  net->train();
  if (bn_eval) net->bn->eval();
  return net;
}

struct Batch {
  torch::Tensor x, y;
};

// Step `step`'s global batch of `global` samples.
inline Batch global_batch(int step, int global) {
  torch::manual_seed(1000 + step);
  return {torch::randn({global, 8}), torch::randint(0, 4, {global}, torch::kLong)};
}

// Rank r's contiguous share of a global batch.
inline Batch shard(const Batch& b, int rank, int size) {
  const int64_t per = b.x.size(0) / size;
  return {b.x.slice(0, rank * per, (rank + 1) * per), b.y.slice(0, rank * per, (rank + 1) * per)};
}

inline double max_difference(torch::nn::Module& a, torch::nn::Module& b) {
  double worst = 0;
  auto pa = a.named_parameters();
  auto pb = b.named_parameters();
  for (const auto& p : pa)
    worst = std::max(worst, (p.value() - pb[p.key()]).abs().max().item<double>());
  return worst;
}

// Every rank's copy of `t` equals rank 0's (exactly).
inline bool same_on_all_ranks(ProcessGroup& pg, const torch::Tensor& t) {
  torch::Tensor mine = t.detach().contiguous().to(torch::kFloat);
  torch::Tensor all = torch::empty({pg.size() * mine.numel()}, torch::kFloat);
  pg.allgather(TensorView{all.data_ptr(), static_cast<size_t>(all.numel()), DType::kF32},
               TensorView{mine.data_ptr(), static_cast<size_t>(mine.numel()), DType::kF32})
      ->wait();
  auto rows = all.view({pg.size(), -1});
  for (int r = 1; r < pg.size(); ++r)
    if (!rows[r].equal(rows[0])) return false;
  return true;
}

}  // namespace dtrain::testing
