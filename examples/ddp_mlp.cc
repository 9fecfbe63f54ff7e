// Data-parallel training of a small MLP on synthetic data with dtrain's DistributedDataParallel.
//
//   build/bin/dtrain run -n 2 -- build/bin/ddp_mlp
//   [rank 0] step 0: loss 1.1532
//   ...
//   [rank 0] step 199: loss 0.0211; parameters identical on every rank: yes
//
// Each rank draws its own batches of y = x . w (plus noise); DDP averages the gradients during
// backward, so every rank takes the same step and the replicas stay identical.
#include <cstdio>
#include <exception>

#include <torch/torch.h>

#include "dtrain/dtrain.h"
#include "dtrain/torch/distributed_data_parallel.h"
#include "dtrain/torch/tensor_view.h"

struct MlpImpl : torch::nn::Module {
  MlpImpl() : fc1(register_module("fc1", torch::nn::Linear(16, 64))),
              fc2(register_module("fc2", torch::nn::Linear(64, 1))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

int main() try {
  auto pg = dtrain::init_process_group();
  torch::manual_seed(1234 + pg->rank());  // different data (and initial weights) per rank
  Mlp model;
  dtrain::DistributedDataParallel ddp(model, pg);  // rank 0's weights everywhere
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  const torch::Tensor w = torch::linspace(-1, 1, 16).unsqueeze(1);  // the same on every rank
  float last = 0;
  for (int step = 0; step < 200; ++step) {
    torch::Tensor x = torch::randn({32, 16});
    torch::Tensor y = x.matmul(w) + 0.01 * torch::randn({32, 1});
    opt.zero_grad();
    torch::Tensor out = ddp.forward([&] { return model->forward(x); });
    torch::Tensor loss = torch::mse_loss(out, y);
    loss.backward();  // gradient buckets are all-reduced while backward runs
    opt.step();
    last = loss.item<float>();
    if (pg->rank() == 0 && step % 50 == 0) std::printf("step %d: loss %.4f\n", step, last);
  }

  // Check: the parameters' sum, all-reduced as a max and as a min, is the same everywhere.
  torch::NoGradGuard no_grad;
  double total = 0;
  for (const auto& p : model->parameters()) total += p.sum().item<double>();
  torch::Tensor hi = torch::tensor({total}, torch::kDouble), lo = hi.clone();
  pg->allreduce(dtrain::view_of(hi), {.op = dtrain::ReduceOp::kMax})->wait();
  pg->allreduce(dtrain::view_of(lo), {.op = dtrain::ReduceOp::kMin})->wait();
  const bool same = hi.item<double>() == lo.item<double>();
  if (pg->rank() == 0)
    std::printf("step 199: loss %.4f; parameters identical on every rank: %s\n", last,
                same ? "yes" : "NO");
  return same && last < 0.1 ? 0 : 1;
} catch (const std::exception& e) {  // dtrain errors say who, what and how long
  std::fprintf(stderr, "ddp_mlp: %s\n", e.what());
  return 1;
}
