// train_sharded: an MLP on Fashion-MNIST with sharded data parallelism (ZeRO stage 1, 2 or 3),
// Adam, and checkpoints that reshard.
//
//   build/bin/dtrain run -n 2 -- build/bin/train_sharded --stage 3
//   build/bin/dtrain run -n 2 -- build/bin/train_sharded --stage 3 --checkpoint-dir ckpt
//   build/bin/dtrain run -n 3 -- build/bin/train_sharded --stage 2 --checkpoint-dir ckpt
//       # resumes the 2-rank run's checkpoint at 3 ranks and another stage
//   build/bin/dtrain run -n 2 -- build/bin/train_sharded --stage 3 --device cuda   # on GPUs
//
// The model: Flatten, then --layers Linear layers of --hidden units with ReLU between them; each
// Linear is a unit. Each rank trains on its share (DistributedSampler) of batches of
// --batch-size images per rank. World rank 0 prints progress, the test accuracy and last one
// machine-readable line:
//   RESULT {"strategy":"zero3","world_size":2,"steps":...,"images_per_sec":...,
//           "initial_loss":...,"final_loss":...,"test_accuracy":...,"parameters":...,
//           "model_states_mib":...,"parameter_sum":...[,"snapshot_stall_ms":...]}
// model_states_mib: what this rank's heap gained from building the model to the end of training
// (jemalloc; parameters, gradients and optimizer state, -1 without jemalloc). parameter_sum: the
// sum of every parameter in double; a resumed run and one that never stopped end with the same.
// snapshot_stall_ms (under --live): rank 0's training thread's mean time per snapshot in memory.
// For tests: --stop-after-steps N checkpoints and exits after step N, --train-samples N trains
// on the first N images only, --fail-in-test R kills rank R as the test begins.
//
// Under `dtrain run --live` a rank's death costs the steps since the newest snapshot, not a
// restart: the survivors re-form, shard the model anew over the new world and restore that
// snapshot, and replacements join the same way. Snapshots are in memory (--snapshot-every, each
// rank's shard also held by a neighbour on another node: dtrain/torch/sharded_snapshot.h), with
// --checkpoint-dir's files for a loss they cannot cover (a rank and its neighbour together):
//   build/bin/dtrain run -n 3 --live --replace 1 -- build/bin/train_sharded --stage 3
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "dtrain/dtrain.h"
#include "dtrain/live_world.h"
#include "dtrain/torch/device.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/fashion_mnist.h"
#include "dtrain/torch/runtime.h"
#include "dtrain/torch/sharded_checkpoint.h"
#include "dtrain/torch/sharded_data_parallel.h"
#include "dtrain/torch/sharded_snapshot.h"
#include "dtrain/torch/tensor_view.h"
#include "sample_log.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string device = "cpu";  // cpu, cuda (this rank's GPU) or cuda:N
  int stage = 3;
  std::string communication_dtype = "float";
  int layers = 4;
  int hidden = 256;
  int epochs = 1;
  int batch_size = 64;
  double lr = 1e-3;
  uint64_t seed = 0;
  std::string data = dtrain::kFashionMnistDir;
  int64_t train_samples = 0;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 100;
  int64_t snapshot_every = 1;
  int keep_checkpoints = 3;
  int64_t stop_after_steps = 0;
  int fail_in_test = -1;  // for tests: the rank (at start) that dies (SIGKILL) as the test begins
  int threads = 0;
  std::string sample_log;
};

torch::nn::Sequential make_model(const Flags& f) {
  torch::nn::Sequential model;
  model->push_back(torch::nn::Flatten());
  int64_t in = 28 * 28;
  for (int i = 0; i < f.layers; ++i) {
    const int64_t out = i + 1 == f.layers ? 10 : f.hidden;
    model->push_back(torch::nn::Linear(in, out));
    if (i + 1 < f.layers) model->push_back(torch::nn::ReLU());
    in = out;
  }
  return model;
}

double allreduce_sum(dtrain::ProcessGroup& g, double v) {
  auto t = torch::tensor({v}, torch::kDouble);
  g.allreduce(dtrain::view_of(t))->wait();
  return t.item<double>();
}

int run(const Flags& flags) {
  // First of all: a GPU asked for and not usable fails here, before any rank waits for another.
  const at::Device device = dtrain::training_device(flags.device);
  const auto runtime = dtrain::configure_runtime(flags.threads);
  // Under `dtrain run --live`, a world whose survivors re-form when a rank dies; they go on
  // from the newest snapshot in memory, the dead rank's shard restored from its neighbour's copy.
  std::unique_ptr<dtrain::LiveWorld> live;
  std::unique_ptr<dtrain::ShardedSnapshot> snapshot;
  std::shared_ptr<dtrain::ProcessGroup> world;
  const char* live_flag = std::getenv("DTRAIN_LIVE");
  if (live_flag != nullptr && std::string(live_flag) == "1") {
    if (flags.checkpoint_dir.empty() && flags.snapshot_every == 0)
      throw dtrain::InvalidArgumentError(
          "dtrain run --live: train_sharded recovers live from its snapshots, the dead rank's "
          "shard included, and --snapshot-every 0 without --checkpoint-dir leaves none: give "
          "--snapshot-every N (in memory) or --checkpoint-dir (files)");
    live = std::make_unique<dtrain::LiveWorld>();
    // Each copy made while the next forward and backward passes run: no step stalls on it.
    if (flags.snapshot_every > 0)
      snapshot = std::make_unique<dtrain::ShardedSnapshot>(
          dtrain::ShardedSnapshotOptions{.copy_in_background = true});
    if (live->too_late()) return 0;  // a replacement after training ended: nothing to do
    world = live->group();
  } else {
    world = dtrain::init_process_group();
  }

  auto test = dtrain::load_fashion_mnist(flags.data, /*train=*/false);
  auto train = dtrain::load_fashion_mnist(flags.data, /*train=*/true);
  if (flags.train_samples > 0 && flags.train_samples < train.size()) {
    train.images = train.images.slice(0, 0, flags.train_samples);
    train.labels = train.labels.slice(0, 0, flags.train_samples);
  }

  const int64_t heap_before = dtrain::heap_allocated_memory();
  dtrain::ShardingOptions options;
  options.stage = flags.stage;
  options.communication_dtype = flags.communication_dtype == "bfloat16" ? at::kBFloat16
                                : flags.communication_dtype == "half"   ? at::kHalf
                                                                        : at::kFloat;
  bool lead = false;
  int n = 0;
  int64_t parameters = 0;
  torch::nn::Sequential model{nullptr};
  std::unique_ptr<dtrain::ShardedDataParallel> sdp;
  std::unique_ptr<torch::optim::Adam> adam;
  std::unique_ptr<dtrain::DistributedSampler> sampler;
  std::unique_ptr<dtrain::ShardedCheckpoint> ckpt;
  dtrain::TrainingProgress at;
  // The model sharded over `world`, its optimizer and sampler, and the newest snapshot restored
  // (what it was; "" when there is none): from memory, else from --checkpoint-dir, at start and
  // again whenever the world changed, since which elements each rank owns depends on its size.
  auto build = [&]() -> std::string {
    lead = world->rank() == 0;
    n = world->size();
    torch::manual_seed(flags.seed);  // the same model on every rank; rank 0's is kept anyway
    model = make_model(flags);
    model->to(device);  // the shards and flat buffers live where the parameters are
    parameters = 0;
    for (const auto& p : model->parameters()) parameters += p.numel();
    ckpt.reset();
    adam.reset();
    sdp = std::make_unique<dtrain::ShardedDataParallel>(model, world, options);
    adam = std::make_unique<torch::optim::Adam>(sdp->parameters(),
                                                torch::optim::AdamOptions(flags.lr));
    sampler = std::make_unique<dtrain::DistributedSampler>(
        static_cast<size_t>(train.size()), n, world->rank(), /*shuffle=*/true, flags.seed);
    at = {};
    if (snapshot) {
      try {
        if (auto from = snapshot->restore(*sdp, adam.get())) {
          at = *from;
          return "the snapshot in memory";
        }
      } catch (const dtrain::DataLossError& e) {
        if (flags.checkpoint_dir.empty()) throw;
        if (lead)
          std::fprintf(stderr, "%s; going on from the newest checkpoint in %s\n", e.what(),
                       flags.checkpoint_dir.c_str());
      }
    }
    if (flags.checkpoint_dir.empty()) return "";
    ckpt = std::make_unique<dtrain::ShardedCheckpoint>(
        dtrain::ShardedCheckpointOptions{.dir = flags.checkpoint_dir,
                                         .keep = flags.keep_checkpoints},
        world);
    auto loaded = ckpt->load_latest(*sdp, adam.get());
    if (!loaded) return "";
    at = loaded->progress;
    return loaded->path;
  };
  const std::string resumed = build();
  if (lead) {
    std::printf("train_sharded: %d rank(s), ZeRO stage %d, %zu units, %lld parameters, batch %d "
                "per rank, %d thread(s)\n",
                n, flags.stage, sdp->units().size(), static_cast<long long>(parameters),
                flags.batch_size, runtime.threads);
    if (!resumed.empty()) {
      const std::string what = fmt::format(
          "from {} (saved at {} rank(s); epoch {}, step {}, {} samples of the epoch done)",
          resumed, at.world_size, at.epoch, at.step, at.epoch_consumed);
      std::printf("resumed %s\n", what.c_str());
      dtrain::announce_resumed(world->rank(), what);  // `dtrain run` reports it for the round
    }
  }
  SampleLog sample_log(flags.sample_log);
  auto progress_now = [&](int64_t step, int64_t epoch) {  // for a snapshot or a checkpoint
    at.step = step;
    at.epoch = epoch;
    at.epoch_consumed = static_cast<int64_t>(sampler->consumed());
    at.epoch_size = train.size();
    return at;
  };
  // After the world changed: the model anew on it from the newest snapshot, the steps since
  // that snapshot redone.
  auto went_on = [&](int generation, double seconds, const std::string& what) {
    const std::string from = build();
    sample_log.set_attempt(generation);
    if (lead)
      std::printf("live world: generation %d of %d rank(s) formed in %.2f s (%s), going on from "
                  "step %lld of %s\n",
                  generation, n, seconds, what.c_str(), static_cast<long long>(at.step),
                  from.empty() ? "the start (no snapshot yet)" : from.c_str());
    std::fflush(stdout);
  };
  // Called in a handler of `e`: when a peer is gone, the survivors re-form and go on from the
  // newest snapshot; any other error is rethrown.
  auto reform_after = [&](const std::exception& e, const char* where) {
    if (!live || !dtrain::LiveWorld::peer_lost(e)) throw;
    if (lead) std::fprintf(stderr, "rank 0: a peer is gone (%s); re-forming\n", e.what());
    const auto reformed = live->reform();
    world = reformed.group;
    went_on(live->generation(), reformed.seconds,
            fmt::format("lost rank(s) {} at start{}", fmt::join(reformed.lost, ", "), where));
  };
  if (live) sample_log.set_attempt(live->generation());

  std::deque<double> recent;
  double initial_loss = -1;
  int64_t step = at.step, images = 0;
  bool stopped = false;
  const auto start = Clock::now();
  auto last_print = start;
  int64_t epoch = at.epoch;
  bool resuming = true;  // the first epoch (or one a change of the world cut) starts at `at`
  double seconds = 0, accuracy = 0, sum = 0;
  int64_t heap_after = 0;
  // The test once trained: true when it ran; false when a rank died during it, which took a
  // shard of the model with it, so that the survivors went back to the newest snapshot to train
  // the steps since it again first.
  auto test_or_reform = [&]() -> bool {
    if (live) live->close();  // replacements still waiting have nothing to join
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
    heap_after = dtrain::heap_allocated_memory();
    try {
      if (flags.fail_in_test == (live ? live->original_rank() : world->rank())) ::raise(SIGKILL);
      // Test accuracy: each rank scores its share of the test set (the forward is collective:
      // every rank runs the same number of chunks).
      torch::NoGradGuard no_grad;
      int64_t correct = 0;
      const int64_t per = (test.size() + n - 1) / n;
      const int64_t first = std::min<int64_t>(test.size(), world->rank() * per);
      const int64_t last = std::min<int64_t>(test.size(), first + per);
      for (int64_t i = 0; i < per; i += 1000) {
        const int64_t lo = std::min(last, first + i), hi = std::min(last, first + i + 1000);
        at::Tensor out = sdp->forward(test.images.slice(0, lo, std::max(lo, hi)).to(device));
        correct +=
            out.argmax(1)
                .eq(test.labels.slice(0, lo, std::max(lo, hi)).to(device))
                .sum()
                .item<int64_t>();
      }
      accuracy = allreduce_sum(*world, static_cast<double>(correct)) / test.size();
      sum = 0;
      for (const auto& [name, value] : sdp->full_parameters())
        sum += value.to(torch::kDouble).sum().item<double>();
      return true;
    } catch (const std::exception& e) {
      reform_after(e, " in the test");
      step = at.step;
      epoch = at.epoch;
      resuming = true;
      return false;
    }
  };
  while (!stopped) {
    if (epoch >= flags.epochs) {
      if (test_or_reform()) break;
      continue;
    }
    sampler->set_epoch(static_cast<uint64_t>(epoch),
                       resuming ? static_cast<size_t>(at.epoch_consumed) : 0);
    resuming = false;
    bool changed = false;
    size_t taken = 0;
    while (true) {
      try {
        if (live) {  // replacements join between steps
          if (auto grown = live->admit_waiting()) {
            world = grown->group;
            went_on(live->generation(), grown->seconds,
                    fmt::format("taking in rank(s) {} at start", fmt::join(grown->joined, ", ")));
            changed = true;
            break;
          }
        }
        auto indices = sampler->next(static_cast<size_t>(flags.batch_size));
        if (!indices) break;
        // Padding (the rest of an epoch dealt over a world that does not divide it) gets no
        // weight under live recovery, so that no sample is trained twice.
        size_t real = indices->size();
        if (live)
          while (real > 0 && sampler->is_padding(taken + real - 1)) --real;
        taken += indices->size();
        auto idx =
            torch::tensor(std::vector<int64_t>(indices->begin(), indices->end()), torch::kLong);
        adam->zero_grad();
        namespace F = torch::nn::functional;
        auto each = F::cross_entropy(sdp->forward(train.images.index_select(0, idx).to(device)),
                                     train.labels.index_select(0, idx).to(device),
                                     F::CrossEntropyFuncOptions().reduction(torch::kNone));
        auto loss = live ? each.slice(0, 0, static_cast<int64_t>(real)).sum() /
                               static_cast<double>(std::max<size_t>(1, real))
                         : each.mean();
        sample_log.record(epoch, step + 1,
                          std::vector<int64_t>(indices->begin(), indices->begin() + real));
        loss.backward();
        if (snapshot) snapshot->wait_copied();  // the step changes what it copies
        adam->step();
        ++step;
        images += static_cast<int64_t>(indices->size()) * n;
        const double l = loss.item<double>();
        if (initial_loss < 0) initial_loss = l;
        recent.push_back(l);
        if (recent.size() > 20) recent.pop_front();
        if (lead && std::chrono::duration<double>(Clock::now() - last_print).count() > 2) {
          last_print = Clock::now();
          const double secs = std::chrono::duration<double>(last_print - start).count();
          std::printf("step %lld, epoch %lld, loss %.4f, %.0f images/s\n",
                      static_cast<long long>(step), static_cast<long long>(epoch), l,
                      images / secs);
          std::fflush(stdout);
        }
        if (snapshot && step % flags.snapshot_every == 0)
          snapshot->take(*sdp, adam.get(), progress_now(step, epoch));
        if (ckpt && (step % flags.checkpoint_every == 0 || step == flags.stop_after_steps))
          ckpt->save(*sdp, adam.get(), progress_now(step, epoch));
      } catch (const std::exception& e) {
        reform_after(e, "");
        changed = true;
        break;
      }
      if (flags.stop_after_steps > 0 && step >= flags.stop_after_steps) {
        stopped = true;
        break;
      }
    }
    if (changed) {
      step = at.step;
      epoch = at.epoch;
      resuming = true;
      continue;
    }
    ++epoch;
  }
  if (stopped) {
    if (lead) std::printf("stopped after step %lld (--stop-after-steps)\n", static_cast<long long>(step));
    world->barrier()->wait();
    return 0;
  }
  const double mean_recent =
      recent.empty() ? 0 : std::accumulate(recent.begin(), recent.end(), 0.0) / recent.size();
  const double images_per_sec = images / seconds;

  if (lead) {
    std::printf("test accuracy %.4f, %.1f s, %.0f images/s\n", accuracy, seconds, images_per_sec);
    nlohmann::ordered_json result = {
        {"strategy", fmt::format("zero{}", flags.stage)},
        {"world_size", n},
        {"communication_dtype", flags.communication_dtype},
        {"epochs", flags.epochs},
        {"steps", step},
        {"images_per_sec", images_per_sec},
        {"initial_loss", initial_loss},
        {"final_loss", mean_recent},
        {"test_accuracy", accuracy},
        {"parameters", parameters},
        {"model_states_mib", heap_before < 0 ? -1.0 : (heap_after - heap_before) / 1048576.0},
        {"parameter_sum", sum},
        {"device", device.str()},
    };
    if (snapshot && snapshot->stats().takes > 0)  // the training thread's time in them
      result["snapshot_stall_ms"] = snapshot->stats().total_stall_ms / snapshot->stats().takes;
    std::printf("RESULT %s\n", result.dump().c_str());
    std::fflush(stdout);
  }
  world->barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train an MLP on Fashion-MNIST with ZeRO (sharded data parallelism)"};
  app.option_defaults()->always_capture_default();
  Flags f;
  app.add_option("--device", f.device,
                 "where to train: cpu, cuda (this rank's GPU: LOCAL_RANK modulo the GPUs visible) "
                 "or cuda:N");
  app.add_option("--stage", f.stage, "ZeRO stage: 1 optimizer state, 2 + gradients, 3 + parameters")
      ->check(CLI::Range(1, 3));
  app.add_option("--communication-dtype", f.communication_dtype, "float, bfloat16 or half")
      ->check(CLI::IsMember({"float", "bfloat16", "half"}));
  app.add_option("--layers", f.layers, "Linear layers")->check(CLI::Range(1, 1024));
  app.add_option("--hidden", f.hidden, "Units of each hidden layer")->check(CLI::Range(1, 1 << 16));
  app.add_option("--epochs", f.epochs)->check(CLI::Range(1, 1000));
  app.add_option("--batch-size", f.batch_size, "Images per rank per step")->check(CLI::Range(1, 1 << 20));
  app.add_option("--lr", f.lr)->check(CLI::Range(0.0, 100.0));
  app.add_option("--seed", f.seed);
  app.add_option("--data", f.data, "Fashion-MNIST's folder");
  app.add_option("--train-samples", f.train_samples, "Train on the first N images only (0 = all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--checkpoint-dir", f.checkpoint_dir, "Checkpoint here, and resume from here");
  app.add_option("--checkpoint-every", f.checkpoint_every, "Steps between checkpoints")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--keep-checkpoints", f.keep_checkpoints)->check(CLI::Range(1, 1000));
  app.add_option("--snapshot-every", f.snapshot_every,
                 "Under dtrain run --live: steps between snapshots in memory, each rank's shard "
                 "also held by a neighbour (0 = none: recover from --checkpoint-dir)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--stop-after-steps", f.stop_after_steps,
                 "Checkpoint and exit after this step (0 = train to the end)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--fail-in-test", f.fail_in_test,
                 "For tests: the rank (at start) that kills itself as the test begins (-1: none)");
  app.add_option("--threads", f.threads, "LibTorch threads per rank (0 = cores / local ranks)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--sample-log", f.sample_log,
                 "Append \"epoch index step attempt\" for every sample trained (all ranks, one "
                 "file); `dtrain chaos` sets it through the environment")
      ->envname("DTRAIN_SAMPLE_LOG");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_sharded: %s\n", e.what());
    return 1;
  }
}
