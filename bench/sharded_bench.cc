// sharded_bench: training throughput and model-state memory of DDP against ShardedDataParallel
// at stages 1, 2 and 3, on one MLP, in alternating rounds (docs/performance.md, "Sharded data
// parallelism").
//
//   build/bin/dtrain run -n 2 -- build/bin/sharded_bench --width 1024 --layers 8 --rounds 5
//
// Each round builds every layout afresh (the same weights) and times --steps steps of Adam after
// one warm-up step; the figures are medians over the rounds, the layouts' order rotating from
// round to round, and the ratios are against DDP. The memory column is what the heap gained over
// the round (jemalloc's count; the least of the rounds): parameters, gradients and optimizer
// state, and what the transport newly kept of messages that came early (at most 16 MiB).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "dtrain/dtrain.h"
#include "dtrain/torch/distributed_data_parallel.h"
#include "dtrain/torch/runtime.h"
#include "dtrain/torch/sharded_data_parallel.h"

namespace {

torch::nn::Sequential make_model(int64_t width, int layers) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int i = 0; i < layers; ++i) {
    model->push_back(torch::nn::Linear(width, width));
    if (i + 1 < layers) model->push_back(torch::nn::ReLU());
  }
  return model;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Result {
  double step_ms = 0;
  int64_t states = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sharded_bench: DDP against ZeRO stages 1-3"};
  int64_t width = 1024, batch = 64;
  int layers = 8, steps = 10, rounds = 5;
  std::string dtype = "float";
  app.add_option("--width", width, "hidden width of the MLP")->check(CLI::Range(1, 1 << 16));
  app.add_option("--layers", layers, "linear layers (each a unit)")->check(CLI::Range(1, 1000));
  app.add_option("--batch", batch, "samples per rank per step")->check(CLI::Range(1, 1 << 20));
  app.add_option("--steps", steps, "timed steps per layout per round")->check(CLI::Range(1, 100000));
  app.add_option("--rounds", rounds, "rounds (medians over them)")->check(CLI::Range(1, 1000));
  app.add_option("--communication-dtype", dtype, "float, bfloat16 or half (sharded layouts)")
      ->check(CLI::IsMember({"float", "bfloat16", "half"}));
  CLI11_PARSE(app, argc, argv);
  try {
    dtrain::configure_runtime();
    auto pg = dtrain::init_process_group();
    const at::ScalarType comm = dtype == "bfloat16" ? at::kBFloat16
                                : dtype == "half"   ? at::kHalf
                                                    : at::kFloat;
    const std::vector<std::string> layouts = {"ddp", "zero1", "zero2", "zero3"};
    std::map<std::string, std::vector<double>> times;
    std::map<std::string, int64_t> states;
    torch::manual_seed(100 + pg->rank());
    const at::Tensor x = torch::randn({batch, width}), y = torch::randn({batch, width});

    auto run = [&](const std::string& layout) {
      const int64_t before = dtrain::heap_allocated_memory();
      auto model = make_model(width, layers);
      std::unique_ptr<dtrain::DistributedDataParallel> ddp;
      std::unique_ptr<dtrain::ShardedDataParallel> sdp;
      std::unique_ptr<torch::optim::Adam> opt;
      if (layout == "ddp") {
        ddp = std::make_unique<dtrain::DistributedDataParallel>(model.ptr(), pg);
        opt = std::make_unique<torch::optim::Adam>(model->parameters(), 1e-4);
      } else {
        dtrain::ShardingOptions o;
        o.stage = layout.back() - '0';
        o.communication_dtype = comm;
        sdp = std::make_unique<dtrain::ShardedDataParallel>(model, pg, o);
        opt = std::make_unique<torch::optim::Adam>(sdp->parameters(), 1e-4);
      }
      auto step = [&] {
        opt->zero_grad();
        at::Tensor out = ddp ? ddp->forward([&] { return model->forward(x); }) : sdp->forward(x);
        torch::nn::functional::mse_loss(out, y).backward();
        opt->step();
      };
      step();  // warm-up: the optimizer's state, the buckets' order
      pg->barrier()->wait();
      const auto start = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) step();
      pg->barrier()->wait();
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count() / steps;
      times[layout].push_back(ms);
      const int64_t kept = dtrain::heap_allocated_memory() - before;
      states[layout] = states.count(layout) ? std::min(states[layout], kept) : kept;
    };
    for (int r = 0; r < rounds; ++r)
      for (size_t i = 0; i < layouts.size(); ++i) run(layouts[(i + r) % layouts.size()]);

    if (pg->rank() == 0) {
      const int64_t params = layers * (width * width + width);
      fmt::print("{} ranks, MLP {} x {} ({} parameters), batch {} per rank, Adam, {} on the wire; "
                 "medians of {} rounds of {} steps\n",
                 pg->size(), layers, width, params, batch, dtype, rounds, steps);
      fmt::print("{:<7} {:>10} {:>9} {:>16} {:>12}\n", "layout", "step ms", "vs ddp",
                 "model states MiB", "bytes/param");
      const double base = median(times["ddp"]);
      for (const auto& l : layouts) {
        const double ms = median(times[l]);
        fmt::print("{:<7} {:>10.1f} {:>9.3f} {:>16.1f} {:>12.2f}\n", l, ms, ms / base,
                   states[l] / 1048576.0, static_cast<double>(states[l]) / params);
      }
    }
    pg->barrier()->wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sharded_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
