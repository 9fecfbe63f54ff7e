// transformer_bench: data-parallel training of bench/transformer_lm.h's 33.7M-parameter
// transformer by dtrain's C++ wrappers: DistributedDataParallel (ddp; ddp-view: each .grad a view
// of its bucket, DdpOptions::gradient_as_bucket_view) and ShardedDataParallel (ZeRO 1-3), in
// alternating rounds. bench/transformer.sh runs it beside torch's DDP and FSDP2 on the
// same model (bench/torch_transformer.py), on dtrain and on gloo (docs/performance.md).
//
//   build/bin/dtrain run -n 2 -- build/bin/transformer_bench --layouts ddp,zero3 --rounds 3
//
// As the Python bench: each rank trains on --tokens tokens a step (one sequence), SGD (lr 0.01),
// each round builds the model from the same seed and times --steps steps after one warm-up step,
// every layout in turn, the order reversed from round to round. Rank 0 prints a RESULT line per
// layout: the median step [every round's], samples/s, the peak of the process's resident memory
// while training (the high-water mark, reset as each round starts), and the first losses.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "dtrain/dtrain.h"
#include "dtrain/torch/distributed_data_parallel.h"
#include "dtrain/torch/runtime.h"
#include "dtrain/torch/sharded_data_parallel.h"
#include "transformer_lm.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The process's resident high-water mark restarts here (Linux 4.0 and later).
void reset_peak_memory() { std::ofstream("/proc/self/clear_refs") << "5"; }

int64_t peak_memory_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

struct Round {
  double step_s = 0;
  int64_t peak = 0;
  std::vector<double> losses;
};

Round run_round(const std::string& layout, const std::shared_ptr<dtrain::ProcessGroup>& pg,
                int steps, int64_t sequence) {
  torch::manual_seed(0);
  auto model = dtrain::bench::make_transformer_lm();
  reset_peak_memory();
  std::unique_ptr<dtrain::DistributedDataParallel> ddp;
  std::unique_ptr<dtrain::ShardedDataParallel> sdp;
  std::unique_ptr<torch::optim::SGD> opt;
  if (layout.starts_with("ddp")) {
    ddp = std::make_unique<dtrain::DistributedDataParallel>(
        model.ptr(), pg, dtrain::DdpOptions{.gradient_as_bucket_view = layout == "ddp-view"});
    opt = std::make_unique<torch::optim::SGD>(model->parameters(), 0.01);
  } else {
    sdp = std::make_unique<dtrain::ShardedDataParallel>(
        model, pg, dtrain::ShardingOptions{.stage = layout.back() - '0'});
    opt = std::make_unique<torch::optim::SGD>(sdp->parameters(), 0.01);
  }
  Round r;
  std::vector<double> times;
  for (int step = 0; step <= steps; ++step) {  // step 0 warms up
    auto [x, y] = dtrain::bench::tokens(step, pg->rank(), 1, sequence);
    pg->barrier()->wait();
    const auto start = std::chrono::steady_clock::now();
    opt->zero_grad();
    at::Tensor logits = ddp ? ddp->forward([&] { return model->forward(x); }) : sdp->forward(x);
    at::Tensor loss = torch::nn::functional::cross_entropy(logits.flatten(0, 1), y.flatten());
    loss.backward();
    opt->step();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (step > 0) {
      times.push_back(s);
      r.losses.push_back(loss.item<double>());
    }
  }
  r.step_s = median(times);
  r.peak = peak_memory_bytes();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"transformer_bench: dtrain's DDP and ZeRO on a 33.7M transformer"};
  std::vector<std::string> layouts = {"ddp", "zero3"};
  int rounds = 3, steps = 10;
  int64_t sequence = 16;
  app.add_option("--layouts", layouts, "ddp, ddp-view, zero1, zero2, zero3")
      ->delimiter(',')
      ->check(CLI::IsMember({"ddp", "ddp-view", "zero1", "zero2", "zero3"}));
  app.add_option("--rounds", rounds)->check(CLI::Range(1, 1000));
  app.add_option("--steps", steps, "timed steps a round")->check(CLI::Range(1, 100000));
  app.add_option("--tokens", sequence, "tokens per rank per step")->check(CLI::Range(1, 256));
  CLI11_PARSE(app, argc, argv);
  try {
    dtrain::configure_runtime();
    auto pg = dtrain::init_process_group();
    std::map<std::string, std::vector<Round>> rounds_of;
    for (int i = 0; i < rounds; ++i) {
      std::vector<std::string> order = layouts;
      if (i % 2 == 1) std::reverse(order.begin(), order.end());
      for (const auto& l : order) rounds_of[l].push_back(run_round(l, pg, steps, sequence));
    }
    if (pg->rank() == 0) {
      for (const auto& l : layouts) {
        std::vector<double> s;
        std::vector<double> peaks;
        for (const auto& r : rounds_of[l]) {
          s.push_back(r.step_s);
          peaks.push_back(static_cast<double>(r.peak));
        }
        const auto& losses = rounds_of[l].front().losses;
        nlohmann::json j = {
            {"run", "cpp-" + l},
            {"world_size", pg->size()},
            {"median_step_s", median(s)},
            {"round_step_s", s},
            {"samples_per_s", pg->size() / median(s)},
            {"peak_rss_bytes", median(peaks)},
            {"losses", std::vector<double>(losses.begin(),
                                           losses.begin() + std::min<size_t>(3, losses.size()))}};
        fmt::print("RESULT {}\n", j.dump());
      }
    }
    pg->barrier()->wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "transformer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
