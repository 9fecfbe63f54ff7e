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
//
// With --snapshots it times ZeRO-3 alone, with a snapshot in memory after every step
// (dtrain::ShardedSnapshot) copied on the training thread, and copied in the background while
// the next forward and backward passes run: the step, the training thread's stall per snapshot,
// and apart (peers) its wait for the slowest rank in the snapshot's all-gather
// (docs/performance.md, "Snapshots of the training state"):
//
//   build/bin/dtrain run -n 3 -- build/bin/sharded_bench --snapshots --width 3584 --layers 8
//       --steps 3 --rounds 3   (a model of 103M parameters: few steps and rounds)
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
#include "dtrain/torch/sharded_snapshot.h"

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


}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sharded_bench: DDP against ZeRO stages 1-3"};
  int64_t width = 1024, batch = 64;
  int layers = 8, steps = 10, rounds = 5;
  std::string dtype = "float";
  bool snapshots = false;
  app.add_option("--width", width, "hidden width of the MLP")->check(CLI::Range(1, 1 << 16));
  app.add_option("--layers", layers, "linear layers (each a unit)")->check(CLI::Range(1, 1000));
  app.add_option("--batch", batch, "samples per rank per step")->check(CLI::Range(1, 1 << 20));
  app.add_option("--steps", steps, "timed steps per layout per round")->check(CLI::Range(1, 100000));
  app.add_option("--rounds", rounds, "rounds (medians over them)")->check(CLI::Range(1, 1000));
  app.add_option("--communication-dtype", dtype, "float, bfloat16 or half (sharded layouts)")
      ->check(CLI::IsMember({"float", "bfloat16", "half"}));
  app.add_flag("--snapshots", snapshots,
               "ZeRO-3 without snapshots, with one in memory after every step copied on the "
               "training thread, and copied in the background");
  CLI11_PARSE(app, argc, argv);
  try {
    dtrain::configure_runtime();
    auto pg = dtrain::init_process_group();
    const at::ScalarType comm = dtype == "bfloat16" ? at::kBFloat16
                                : dtype == "half"   ? at::kHalf
                                                    : at::kFloat;
    const std::string copied = "zero3+snapshot", background = "zero3+snapshot in background";
    const std::vector<std::string> layouts =
        snapshots ? std::vector<std::string>{"zero3", copied, background}
                  : std::vector<std::string>{"ddp", "zero1", "zero2", "zero3"};
    std::map<std::string, std::vector<double>> times, stalls, peers, copies;
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
        o.stage = layout[4] - '0';
        o.communication_dtype = comm;
        sdp = std::make_unique<dtrain::ShardedDataParallel>(model, pg, o);
        opt = std::make_unique<torch::optim::Adam>(sdp->parameters(), 1e-4);
      }
      std::unique_ptr<dtrain::ShardedSnapshot> snap;
      if (layout == copied || layout == background)
        snap = std::make_unique<dtrain::ShardedSnapshot>(
            dtrain::ShardedSnapshotOptions{.copy_in_background = layout == background});
      int64_t taken = 0;
      auto step = [&] {
        opt->zero_grad();
        at::Tensor out = ddp ? ddp->forward([&] { return model->forward(x); }) : sdp->forward(x);
        torch::nn::functional::mse_loss(out, y).backward();
        if (snap) snap->wait_copied();
        opt->step();
        if (snap) snap->take(*sdp, opt.get(), {.step = ++taken});
      };
      step();  // warm-up: the optimizer's state, the buckets' order
      const double first_stall = snap ? snap->stats().total_stall_ms : 0;
      const double first_peers = snap ? snap->stats().total_peers_ms : 0;
      pg->barrier()->wait();
      const auto start = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) step();
      pg->barrier()->wait();
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count() / steps;
      times[layout].push_back(ms);
      if (snap) {
        const auto st = snap->stats();  // the warm-up's snapshot left out
        stalls[layout].push_back((st.total_stall_ms - first_stall) / steps);
        peers[layout].push_back((st.total_peers_ms - first_peers) / steps);
        snap->wait_copied();  // the last snapshot's copy, which no step waited for
        copies[layout].push_back(snap->stats().copy_ms);
      }
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
      if (snapshots) {
        fmt::print("{:<30} {:>10} {:>10} {:>20} {:>16} {:>10}\n", "layout", "step ms",
                   "vs zero3", "stall ms a snapshot", "peers ms", "copy ms");
        const double base = median(times["zero3"]);
        for (const auto& l : layouts) {
          const double ms = median(times[l]);
          fmt::print("{:<30} {:>10.1f} {:>10.3f} {:>20.1f} {:>16.1f} {:>10.1f}\n", l, ms,
                     ms / base, median(stalls[l]), median(peers[l]), median(copies[l]));
        }
      } else {
        fmt::print("{:<7} {:>10} {:>9} {:>16} {:>12}\n", "layout", "step ms", "vs ddp",
                   "model states MiB", "bytes/param");
        const double base = median(times["ddp"]);
        for (const auto& l : layouts) {
          const double ms = median(times[l]);
          fmt::print("{:<7} {:>10.1f} {:>9.3f} {:>16.1f} {:>12.2f}\n", l, ms, ms / base,
                     states[l] / 1048576.0, static_cast<double>(states[l]) / params);
        }
      }
    }
    pg->barrier()->wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sharded_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
