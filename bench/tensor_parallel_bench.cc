// tensor_parallel_bench: training steps of transformer blocks cut by dtrain's tensor-parallel
// layers; bench/tensor_parallel.sh runs it beside the same blocks cut by torch's DTensor
// (bench/torch_tensor_parallel.py), alternating (docs/performance.md, "Tensor parallelism").
//
//   build/bin/dtrain run -n 2 -- build/bin/tensor_parallel_bench --blocks 4 --steps 10
//
// A block: LayerNorm, causal self-attention (ParallelSelfAttention: heads cut across the ranks),
// LayerNorm, MLP (ParallelMLP: hidden -> ffn cut by columns, GELU, ffn -> hidden by rows), each
// with its residual; two all-reduces of [batch, sequence, hidden] forward and two backward. The
// input is random and the loss the mean squared error against a random target; SGD. The step
// time is the median of --steps timed steps after --warmup; rank 0 prints one RESULT line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "dtrain/dtrain.h"
#include "dtrain/torch/runtime.h"
#include "dtrain/torch/tensor_parallel.h"

namespace {

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t hidden, int64_t heads, int64_t ffn, std::shared_ptr<dtrain::ProcessGroup> g)
      : norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        attention(register_module("attention",
                                  dtrain::ParallelSelfAttention(hidden, heads, g, true))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        mlp(register_module("mlp", dtrain::ParallelMLP(hidden, ffn, g))) {}

  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x + attention->forward(norm1->forward(x));
    return h + mlp->forward(norm2->forward(h));
  }

  torch::nn::LayerNorm norm1;
  dtrain::ParallelSelfAttention attention;
  torch::nn::LayerNorm norm2;
  dtrain::ParallelMLP mlp;
};
TORCH_MODULE(Block);

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tensor_parallel_bench: transformer blocks on dtrain's tensor-parallel layers"};
  int64_t hidden = 512, heads = 8, ffn = 2048, batch = 4, sequence = 64;
  int blocks = 4, steps = 10, warmup = 2;
  app.add_option("--hidden", hidden)->check(CLI::Range(1, 1 << 16));
  app.add_option("--heads", heads)->check(CLI::Range(1, 1 << 10));
  app.add_option("--ffn", ffn)->check(CLI::Range(1, 1 << 18));
  app.add_option("--blocks", blocks)->check(CLI::Range(1, 1000));
  app.add_option("--batch", batch, "sequences per step")->check(CLI::Range(1, 1 << 16));
  app.add_option("--sequence", sequence, "tokens per sequence")->check(CLI::Range(1, 1 << 16));
  app.add_option("--steps", steps, "timed steps")->check(CLI::Range(1, 100000));
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::Range(0, 1000));
  CLI11_PARSE(app, argc, argv);
  try {
    dtrain::configure_runtime();
    auto pg = dtrain::init_process_group();
    torch::manual_seed(0);  // the same weights drawn on every rank; each keeps its part
    torch::nn::Sequential model;
    for (int b = 0; b < blocks; ++b) model->push_back(Block(hidden, heads, ffn, pg));
    torch::optim::SGD opt(model->parameters(), 1e-3);
    const at::Tensor x = torch::randn({batch, sequence, hidden});
    const at::Tensor y = torch::randn({batch, sequence, hidden});
    std::vector<double> times;
    for (int s = 0; s < warmup + steps; ++s) {
      pg->barrier()->wait();
      const auto start = std::chrono::steady_clock::now();
      opt.zero_grad();
      torch::nn::functional::mse_loss(model->forward(x), y).backward();
      opt.step();
      if (s >= warmup)
        times.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count());
    }
    if (pg->rank() == 0) {
      nlohmann::json r = {{"layers", "dtrain"},   {"ranks", pg->size()}, {"blocks", blocks},
                          {"hidden", hidden},     {"heads", heads},      {"ffn", ffn},
                          {"batch", batch},       {"sequence", sequence},
                          {"step_ms", median(times)}};
      fmt::print("RESULT {}\n", r.dump());
    }
    pg->barrier()->wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tensor_parallel_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
