// snapshot_bench: what taking a snapshot of the training state costs a step. A transformer of
// about 100M parameters (bench/transformer_lm.h, width 768, 12 layers) trains with Adam in one
// process and commits after every step through a CheckpointManager (files, CRC-32, fsync,
// rename; in /dev/shm by default, as `dtrain run`'s in-memory commits), in three modes taken in
// turn, the order reversed from round to round:
//   none        no snapshot: the step alone
//   thread      the tensors copied by save() on the training thread (copy_in_background off)
//   background  the parameters and Adam's state copied by the writing thread while the next
//               step's forward and backward run; the optimizer step waits for the copy
//
//   build/bin/snapshot_bench --rounds 3 --steps 9 --every 4
//
// A snapshot is taken after every --every steps (writing the whole state can take longer than a
// step: a snapshot more often would wait for the previous write).
// Its stall is the training thread's time in save() (with any wait for the previous write) and
// in the next step's wait_copied(): what training pays for it. Printed per mode, medians: the
// step (every step counted, with and without a snapshot), the stall of a snapshot, and the copy
// and the write on the writing thread.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/runtime.h"
#include "transformer_lm.h"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Samples {
  std::vector<double> step_ms, stall_ms, copy_ms, write_ms;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"snapshot_bench: a training step's stall for a snapshot of a ~100M model"};
  int rounds = 3, steps = 9, every = 4, layers = 12;
  int64_t width = 768, sequence = 128, batch = 1;
  std::string dir = fmt::format("/dev/shm/dtrain-snapshot-bench-{}", ::getpid());
  std::string modes_text = "none,thread,background";
  app.add_option("--rounds", rounds, "rounds of every mode");
  app.add_option("--steps", steps, "steps counted per mode and round (after one not counted)");
  app.add_option("--every", every,
                 "steps between snapshots (a write must end before the next snapshot starts)");
  app.add_option("--layers", layers, "transformer layers (12: about 100M parameters)");
  app.add_option("--width", width, "model width");
  app.add_option("--sequence", sequence, "tokens per sequence");
  app.add_option("--batch", batch, "sequences per step");
  app.add_option("--dir", dir, "where the snapshots are written (removed at the end)");
  app.add_option("--modes", modes_text, "none, thread and background, comma-separated");
  CLI11_PARSE(app, argc, argv);

  std::vector<std::string> modes;
  for (size_t at = 0; at <= modes_text.size();) {
    const size_t comma = std::min(modes_text.find(',', at), modes_text.size());
    modes.push_back(modes_text.substr(at, comma - at));
    at = comma + 1;
  }
  for (const auto& m : modes)
    if (m != "none" && m != "thread" && m != "background") {
      std::fprintf(stderr, "snapshot_bench: unknown mode '%s' (none, thread, background)\n",
                   m.c_str());
      return 2;
    }

  auto runtime = dtrain::configure_runtime(0);
  torch::manual_seed(0);
  dtrain::bench::TransformerShape shape;
  shape.vocab = 10240;
  shape.width = width;
  shape.layers = layers;
  shape.heads = 12;
  shape.ff = 4 * width;
  auto model = dtrain::bench::make_transformer_lm(shape);
  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-4));

  // One manager per mode, each with its own directory and spare buffers, kept over the rounds.
  std::map<std::string, std::unique_ptr<dtrain::CheckpointManager>> managers;
  for (const auto& m : modes) {
    if (m == "none") continue;
    dtrain::CheckpointOptions o;
    o.dir = dir + "/" + m;
    o.keep = 1;
    o.copy_in_background = m == "background";
    managers[m] = std::make_unique<dtrain::CheckpointManager>(o);
  }
  std::printf(
      "snapshot_bench: %.1fM parameters, Adam (%.2f GB of state to snapshot), %lld x %lld "
      "tokens a step, %d intra-op threads, snapshots to %s\n",
      parameters / 1e6, 3.0 * parameters * 4 / 1e9, static_cast<long long>(batch),
      static_cast<long long>(sequence), at::get_num_threads(), dir.c_str());
  std::fflush(stdout);

  std::map<std::string, Samples> samples;
  int64_t step = 0;
  double last_loss = 0;
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::string> order = modes;
    if (round % 2 == 1) std::reverse(order.begin(), order.end());
    for (const auto& mode : order) {
      dtrain::CheckpointManager* mode_manager = mode == "none" ? nullptr : managers[mode].get();
      double snapshot_stall_ms = 0;  // of the snapshot taken after the previous step
      for (int s = 0; s <= steps; ++s, ++step) {
        // A snapshot after every `every`-th step (the warm-up's first, not counted); the step
        // after it waits for its copy before the optimizer step.
        const bool snapshot_step = s % every == 0, next_step = s % every == 1;
        dtrain::CheckpointManager* manager = mode_manager;
        const auto start = Clock::now();
        auto [input, target] = dtrain::bench::tokens(step, 0, batch, sequence, shape.vocab);
        adam.zero_grad();
        at::Tensor logits = model->forward(input);
        at::Tensor loss = torch::nn::functional::cross_entropy(logits.reshape({-1, shape.vocab}),
                                                               target.reshape({-1}));
        loss.backward();
        if (manager) {
          const auto wait_start = Clock::now();
          manager->wait_copied();
          snapshot_stall_ms += ms_since(wait_start);
        }
        adam.step();
        Samples& out = samples[mode];
        if (manager && next_step && s > 1) out.stall_ms.push_back(snapshot_stall_ms);
        if (manager && snapshot_step) {
          dtrain::TrainingProgress at;
          at.step = step + 1;
          const auto save_start = Clock::now();
          manager->save(*model, &adam, at);  // waits for the previous write, if still going
          snapshot_stall_ms = ms_since(save_start);
        }
        const double total_ms = ms_since(start);
        if (s == 0) continue;  // the warm-up step: the mode's previous write, first allocations
        out.step_ms.push_back(total_ms);
        if (manager && snapshot_step) {
          const auto st = manager->stats();  // of the last write completed
          out.copy_ms.push_back(st.copy_ms);
          out.write_ms.push_back(st.write_ms);
        }
        last_loss = loss.item<double>();
      }
      std::printf("round %d: %s done, loss %.3f\n", round, mode.c_str(), last_loss);
      std::fflush(stdout);
    }
  }
  for (auto& [mode, manager] : managers) manager->wait();

  const double base = samples.count("none") ? median(samples["none"].step_ms) : 0;
  std::printf("%-11s %10s %10s %12s %12s %12s\n", "mode", "step ms", "vs none", "stall ms",
              "copy ms", "write ms");
  for (const auto& mode : modes) {
    const Samples& s = samples[mode];
    const double step_ms = median(s.step_ms);
    std::printf("%-11s %10.0f %10s %12.1f %12.1f %12.1f\n", mode.c_str(), step_ms,
                base > 0 ? fmt::format("{:+.1f}%", 100 * (step_ms / base - 1)).c_str() : "-",
                median(s.stall_ms), median(s.copy_ms), median(s.write_ms));
  }
  std::error_code ec;
  managers.clear();
  std::filesystem::remove_all(dir, ec);
  return 0;
}
