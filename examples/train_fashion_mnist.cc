// train_fashion_mnist: the ConvNet of the PyTorch tutorial trained on Fashion-MNIST, data
// parallel over the ranks of a dtrain job.
//
//   build/bin/train_fashion_mnist --epochs 1                                  # one process
//   build/bin/dtrain run -n 2 -- build/bin/train_fashion_mnist --epochs 1    # DDP over 2 ranks
//   build/bin/dtrain run -n 2 -- build/bin/train_fashion_mnist --strategy optimizer
//   build/bin/dtrain run -n 2 -- build/bin/train_fashion_mnist --comm-hook int8   # 1 byte a value
//   build/bin/dtrain run --servers 1 -n 2 -- build/bin/train_fashion_mnist --strategy ps --ps-mode ssp
//   build/bin/dtrain run -n 2 -- build/bin/train_fashion_mnist --checkpoint-dir ckpt
//       --checkpoint-every 100                  # (one line) run it again after a crash: it resumes
//   build/bin/dtrain run -n 2 -- build/bin/train_fashion_mnist --device cuda   # this rank's GPU
//
// --device cuda trains on the GPU LOCAL_RANK picks (modulo those visible); the native backend
// takes the GPU's tensors through host memory, so several ranks may share one GPU. Without a
// usable GPU every rank fails at once, saying what it saw (CUDA_VISIBLE_DEVICES, the driver).
//
// Data: Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist, or --data DIR), in
// memory; or, with --data-shards 'DIR/train-*.tfrecord', TFRecord shards that
// `dtrain data write --fashion-mnist --out DIR/train --shards 4` wrote, read by --readers
// background threads per rank (docs/data.md); RESULT then adds input_wait_ms_per_step and
// bad_records_skipped (--skip-bad-records trains without damaged records instead of failing).
// --batch-size is per rank. Rank 0 prints the runtime in use, progress (a bar on a terminal,
// a line every few seconds otherwise: step, epoch, loss, images/s, time left), the test
// accuracy, and last one machine-readable line:
//   RESULT {"strategy":"ddp","world_size":2,"epochs":1,"steps":300,"images_per_sec":...,
//           "initial_loss":...,"final_loss":...,"test_accuracy":...,"eval_loss":...}
// final_loss averages the batch losses of the last 20 steps each process trained (fewer after a
// resume near the end: the window is not checkpointed); eval_loss is the test set's mean loss.
// images_per_sec adds up the rates of all ranks. DTRAIN_TIMELINE=FILE records a Chrome trace.
//
// Checkpoints (docs/fault_tolerance.md): with --checkpoint-dir DIR, rank 0 saves every
// --checkpoint-every steps (and at the end) in the background, keeping the newest
// --keep-checkpoints, and a run started on DIR resumes from its newest good checkpoint, on any
// number of ranks, printing
//   resumed from DIR/step-000120 (epoch 0, step 120, 24000 of 60000 samples of the epoch done,
//   saved at world size 2)
// With the same world size and --deterministic, a resumed run ends with the very parameters of
// one that never stopped. Under elastic `dtrain run` (DTRAIN_COMMIT_DIR set), the node's lowest
// rank also commits the state to memory every --commit-every steps (1), and a restarted job
// resumes from the newest state any rank holds, commit or checkpoint, printing
//   resumed from /dev/shm/dtrain-commit-dtrain-vm-4242/step-000041 (epoch 1, step 41, ...):
//   in-memory commit, loaded by rank 0; the steps after 41 are trained again (at most 1)
// Preemption: with --checkpoint-dir, SIGTERM or SIGUSR1 (Kubernetes', Slurm's warnings, or
// `dtrain run` passing them on) stops every rank after the same step; rank 0 saves it and all
// exit 75 (dtrain::Preemption::kRequeueExitCode); run again, it resumes from there.
// For tests: --stop-after-steps N checkpoints and exits after step N (as a preempted job would),
// --sample-log FILE (or DTRAIN_SAMPLE_LOG) appends "epoch index step restart" for every sample a
// rank trains,
// --train-samples N trains on the first N images only, --late-rank R --late-ms M has rank R
// re-form M ms late after a failure under --live (as if stopped meanwhile).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "dtrain/data/sharded_dataset.h"
#include "dtrain/dtrain.h"
#include "dtrain/live_world.h"
#include "dtrain/step_shape.h"
#include "dtrain/ps.h"
#include "dtrain/torch/broadcast.h"
#include "dtrain/preemption.h"
#include "dtrain/progress.h"
#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/commit.h"
#include "dtrain/torch/device.h"
#include "dtrain/torch/distributed_data_parallel.h"
#include "dtrain/torch/distributed_optimizer.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/parameter_server.h"
#include "dtrain/torch/fashion_mnist.h"
#include "dtrain/torch/runtime.h"
#include "dtrain/torch/safetensors.h"
#include "dtrain/timeline.h"
#include "sample_log.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace nn = torch::nn;

// Parameter names as PyTorch gives them: layer1.0.weight, layer1.1.running_mean, ..., fc.bias.
struct ConvNetImpl : nn::Module {
  nn::Sequential layer1{nn::Conv2d(nn::Conv2dOptions(1, 16, 5).padding(2)), nn::BatchNorm2d(16),
                        nn::ReLU(), nn::MaxPool2d(nn::MaxPool2dOptions(2))};
  nn::Sequential layer2{nn::Conv2d(nn::Conv2dOptions(16, 32, 5).padding(2)), nn::BatchNorm2d(32),
                        nn::ReLU(), nn::MaxPool2d(nn::MaxPool2dOptions(2))};
  nn::Linear fc{7 * 7 * 32, 10};

  ConvNetImpl() {
    register_module("layer1", layer1);
    register_module("layer2", layer2);
    register_module("fc", fc);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = layer2->forward(layer1->forward(x));
    return fc->forward(x.reshape({x.size(0), -1}));
  }
};
TORCH_MODULE(ConvNet);

struct Flags {
  std::string strategy = "ddp";
  std::string device = "cpu";  // cpu, cuda (this rank's GPU) or cuda:N
  int epochs = 1;
  int batch_size = 100;
  double lr = 0.01;
  double momentum = 0.9;
  uint64_t seed = 42;
  int threads = 0;
  int64_t max_steps = 0;
  bool no_shuffle = false;
  std::string init;
  std::string save;
  std::string data = dtrain::kFashionMnistDir;
  std::string data_shards;  // TFRecord shards (`dtrain data write --fashion-mnist`) instead
  int readers = 2;          // background reader threads per rank, with --data-shards
  bool skip_bad_records = false;  // with --data-shards: replace bad records instead of failing
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int keep_checkpoints = 3;
  int64_t commit_every = -1;  // -1: 1 when DTRAIN_COMMIT_DIR is set, else off
  bool deterministic = false;
  std::string comm_hook = "allreduce";  // how DDP reduces its buckets
  std::string sample_log;
  int64_t stop_after_steps = 0;
  int64_t train_samples = 0;
  std::string ps_mode = "sync";
  uint32_t staleness = 2;
  int straggler_rank = -1;
  int straggler_ms = 0;
  int late_rank = -1;  // for tests: under --live, this rank (at start) re-forms late
  int late_ms = 0;
  std::string on_resize = "keep-rank-batch";  // under live recovery: dtrain/step_shape.h
};

bool launched_distributed() {
  return std::getenv("WORLD_SIZE") != nullptr || std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
         std::getenv("PMI_SIZE") != nullptr || std::getenv("SLURM_NTASKS") != nullptr;
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == "1";
}

std::string format_duration(double seconds) {
  int s = static_cast<int>(std::lround(std::max(0.0, seconds)));
  return s >= 60 ? fmt::format("{}m{:02d}s", s / 60, s % 60) : fmt::format("{}s", s);
}

// Where the training images come from: Fashion-MNIST in memory, dealt out by
// DistributedSampler, or (--data-shards) TFRecord shards written by `dtrain data write
// --fashion-mnist` (a record: the label byte, then 784 pixels), read and decoded ahead of the
// training loop by dtrain::data::ShardedDataset on --readers threads. Either deals each epoch
// record by record and resumes from the same kind of position (an epoch and the samples of it
// consumed), on any number of ranks.
class TrainingInput {
 public:
  TrainingInput(dtrain::FashionMnist train, int world, int rank, bool shuffle, uint64_t seed)
      : memory_(std::move(train)),
        sampler_(std::make_unique<dtrain::DistributedSampler>(static_cast<size_t>(memory_->size()),
                                                              world, rank, shuffle, seed)) {}

  TrainingInput(const std::string& shards, int world, int rank, bool shuffle, uint64_t seed,
                int readers, bool skip_bad_records) {
    dtrain::data::ShardedDatasetOptions o;
    o.on_bad_record = skip_bad_records ? dtrain::data::OnBadRecord::kSkip
                                       : dtrain::data::OnBadRecord::kFail;
    o.rank = rank;
    o.world_size = world;
    o.seed = seed;
    o.shuffle = shuffle;
    o.readers = readers;
    o.decode = [](dtrain::data::Record& r) {  // on the reader threads
      if (r.bytes.size() != 1 + 28 * 28)
        throw dtrain::InvalidArgumentError(fmt::format(
            "a Fashion-MNIST record holds 785 bytes (a label, 28x28 pixels), this one {}",
            r.bytes.size()));
      auto pixels = torch::from_blob(r.bytes.data() + 1, {1, 28, 28}, torch::kUInt8);
      r.value = std::make_pair(pixels.to(torch::kFloat).div_(255.0f),
                               static_cast<int64_t>(std::to_integer<uint8_t>(r.bytes[0])));
    };
    shards_ = std::make_unique<dtrain::data::ShardedDataset>(std::vector<std::string>{shards}, o);
  }

  int64_t size() const {
    return shards_ ? static_cast<int64_t>(shards_->size()) : memory_->size();
  }
  // Deals the samples over another world (live recovery); set_epoch must follow.
  void regroup(int world, int rank, bool shuffle, uint64_t seed) {
    if (shards_) {
      shards_->regroup(rank, world);
      return;
    }
    sampler_ = std::make_unique<dtrain::DistributedSampler>(static_cast<size_t>(memory_->size()),
                                                            world, rank, shuffle, seed);
  }
  void set_epoch(uint64_t epoch, uint64_t consumed) {
    taken_ = 0;
    if (shards_)
      shards_->set_epoch(epoch, consumed);
    else
      sampler_->set_epoch(epoch, static_cast<size_t>(consumed));
  }
  size_t num_samples() const {
    return shards_ ? static_cast<size_t>(shards_->num_samples()) : sampler_->num_samples();
  }
  uint64_t consumed(size_t taken) const {
    return shards_ ? shards_->consumed(taken) : sampler_->consumed(taken);
  }
  // The next (up to) n samples of this rank's epoch: images [b, 1, 28, 28], labels [b], and the
  // samples' numbers in the training set (for --sample-log). `padding` counts the last of them
  // that only pad the epoch to equal lengths per rank (the sampler's).
  void next(size_t n, torch::Tensor& x, torch::Tensor& y, std::vector<int64_t>& ids,
            size_t& padding) {
    n = std::min(n, num_samples() - taken_);
    ids.clear();
    padding = 0;
    if (!shards_) {
      const auto& indices = sampler_->indices();
      ids.assign(indices.begin() + static_cast<ptrdiff_t>(taken_),
                 indices.begin() + static_cast<ptrdiff_t>(taken_ + n));
      for (size_t k = taken_; k < taken_ + n; ++k) padding += sampler_->is_padding(k) ? 1 : 0;
      auto idx = torch::from_blob(ids.data(), {static_cast<int64_t>(n)}, torch::kLong);
      x = memory_->images.index_select(0, idx);
      y = memory_->labels.index_select(0, idx);
      taken_ += n;
      return;
    }
    std::vector<torch::Tensor> images;
    std::vector<int64_t> labels;
    const auto start = Clock::now();
    for (size_t i = 0; i < n; ++i) {
      padding += shards_->is_padding(taken_ + i) ? 1 : 0;
      auto record = shards_->next();
      auto& [image, label] = std::any_cast<std::pair<torch::Tensor, int64_t>&>(record->value);
      images.push_back(std::move(image));
      labels.push_back(label);
      ids.push_back(static_cast<int64_t>(record->id));
    }
    waited_ += std::chrono::duration<double>(Clock::now() - start).count();
    x = torch::stack(images);
    y = torch::tensor(labels, torch::kLong);
    taken_ += n;
  }
  // Seconds next() spent waiting for records from the shards (0 in memory).
  double waited_seconds() const { return waited_; }
  // Bad records replaced so far (--skip-bad-records), each described.
  std::vector<std::string> skipped() const {
    return shards_ ? shards_->skipped() : std::vector<std::string>{};
  }
  bool from_shards() const { return shards_ != nullptr; }

 private:
  std::optional<dtrain::FashionMnist> memory_;
  std::unique_ptr<dtrain::DistributedSampler> sampler_;
  std::unique_ptr<dtrain::data::ShardedDataset> shards_;
  size_t taken_ = 0;
  double waited_ = 0;
};

// Rank 0's progress: a redrawn bar on a terminal, a line every few seconds in a log.
class Progress {
 public:
  Progress(bool enabled, int64_t total) : enabled_(enabled), total_(total), tty_(isatty(1) == 1) {}
  void update(int64_t step, int epoch, double loss, double images_per_sec, double seconds_left,
              bool force) {
    if (!enabled_) return;
    auto now = Clock::now();
    auto interval = tty_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(5000);
    if (!force && now - last_ < interval) return;
    last_ = now;
    if (tty_) {
      constexpr int kWidth = 30;
      int filled = static_cast<int>(kWidth * step / std::max<int64_t>(1, total_));
      std::printf("\r[%s%s] step %lld/%lld epoch %d loss %.4f %.0f img/s %s left   ",
                  std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                  static_cast<long long>(step), static_cast<long long>(total_), epoch, loss,
                  images_per_sec, format_duration(seconds_left).c_str());
      if (step == total_) std::printf("\n");
    } else {
      std::printf("step %lld/%lld epoch %d loss %.4f images/s %.0f time left %s\n",
                  static_cast<long long>(step), static_cast<long long>(total_), epoch, loss,
                  images_per_sec, format_duration(seconds_left).c_str());
    }
    std::fflush(stdout);
  }

 private:
  bool enabled_;
  int64_t total_;
  bool tty_;
  Clock::time_point last_{};
};

int64_t allreduce_sum(dtrain::ProcessGroup* pg, int64_t v) {
  if (pg == nullptr) return v;
  std::vector<int64_t> x = {v};
  pg->allreduce(dtrain::TensorView::of(x))->wait();
  return x[0];
}

double allreduce(dtrain::ProcessGroup* pg, double v, dtrain::ReduceOp op) {
  if (pg == nullptr) return v;
  std::vector<double> x = {v};
  dtrain::AllreduceOptions o;
  o.op = op;
  pg->allreduce(dtrain::TensorView::of(x), o)->wait();
  return x[0];
}

double allreduce_mean(dtrain::ProcessGroup* pg, double v) {
  return allreduce(pg, v, dtrain::ReduceOp::kAvg);
}

// DDP's options from the flags.
dtrain::DdpOptions ddp_options_of(const Flags& flags) {
  dtrain::DdpOptions o;
  // Deterministic: keep the initial bucket layout. A resumed run starts with it while one that
  // never stopped has rebuilt its buckets by then, and on 3 or more ranks the layout decides
  // the order of each element's floating-point sum (2 ranks add commutatively, exactly).
  if (flags.deterministic) o.rebuild_buckets = false;
  if (flags.comm_hook == "fp16") o.comm_hook = dtrain::fp16_compress_hook();
  if (flags.comm_hook == "bf16") o.comm_hook = dtrain::bf16_compress_hook();
  if (flags.comm_hook == "int8") o.comm_hook = dtrain::int8_compress_hook();
  if (flags.comm_hook == "int4") o.comm_hook = dtrain::int4_compress_hook();
  return o;
}

int run(const Flags& flags) {
  // First of all: a GPU asked for and not usable fails here, before any rank waits for another.
  const at::Device device = dtrain::training_device(flags.device);
  if (flags.strategy == "ps" && !device.is_cpu())
    throw dtrain::InvalidArgumentError(
        "--strategy ps keeps the parameters on the servers, in host memory: train with --device "
        "cpu, or with --strategy ddp or optimizer on a GPU");
  // Bit-exact resume needs the same arithmetic in every run: one thread (a reduction split over
  // threads adds in another order) and no nondeterministic kernels.
  if (flags.deterministic) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  auto runtime =
      dtrain::configure_runtime(flags.threads > 0 ? flags.threads : (flags.deterministic ? 1 : 0));
  std::shared_ptr<dtrain::ProcessGroup> pg;
  // Under `dtrain run --live`, a world whose survivors re-form it when a rank dies.
  std::unique_ptr<dtrain::LiveWorld> live;
  if (launched_distributed() && env_flag("DTRAIN_LIVE")) {
    if (flags.commit_every > 0)
      throw dtrain::InvalidArgumentError(
          "dtrain run --live: train_fashion_mnist recovers live without --commit-every (the "
          "survivors hold the state: --checkpoint-dir keeps it on disk)");
    // Only synchronous workers fail together when one dies (their reads wait for it); others
    // would train on without noticing, the dead one's samples never trained.
    if (flags.strategy == "ps" && flags.ps_mode != "sync")
      throw dtrain::InvalidArgumentError(fmt::format(
          "dtrain run --live with --strategy ps needs --ps-mode sync: with --ps-mode {} the "
          "workers do not wait for each other, so the survivors of a death would not notice it "
          "and the rest of its samples would go untrained",
          flags.ps_mode));
    live = std::make_unique<dtrain::LiveWorld>();
    if (live->too_late()) {
      std::printf("rank %d at start, a replacement: training ended before the others could take "
                  "it in; nothing to do\n",
                  live->original_rank());
      return 0;
    }
    pg = live->group();
  } else if (launched_distributed()) {
    pg = dtrain::init_process_group();
  }
  int rank = pg ? pg->rank() : 0;
  int world = pg ? pg->size() : 1;
  bool lead = rank == 0;
  if (lead)
    std::printf("train_fashion_mnist: %d rank(s), strategy %s, batch %d per rank, %d thread(s), "
                "allocator %s, BLAS %s\n",
                world,
                flags.strategy == "ps" ? fmt::format("ps ({})", flags.ps_mode).c_str()
                : world > 1            ? flags.strategy.c_str()
                                       : "single", flags.batch_size,
                runtime.threads, runtime.allocator.c_str(), runtime.blas.c_str());

  torch::manual_seed(flags.seed);
  ConvNet model;
  if (!flags.init.empty()) dtrain::load_module_state(*model, flags.init);
  model->to(device);

  auto test = dtrain::load_fashion_mnist(flags.data, /*train=*/false);
  std::unique_ptr<TrainingInput> input;
  if (!flags.data_shards.empty()) {
    if (flags.train_samples > 0)
      throw dtrain::InvalidArgumentError(
          "--train-samples applies to the data set in memory; with --data-shards, write shards "
          "of fewer images instead");
    input = std::make_unique<TrainingInput>(flags.data_shards, world, rank, !flags.no_shuffle,
                                            flags.seed, flags.readers, flags.skip_bad_records);
  } else {
    auto train = dtrain::load_fashion_mnist(flags.data, /*train=*/true);
    if (flags.train_samples > 0 && flags.train_samples < train.size()) {
      train.images = train.images.slice(0, 0, flags.train_samples);
      train.labels = train.labels.slice(0, 0, flags.train_samples);
    }
    input = std::make_unique<TrainingInput>(std::move(train), world, rank, !flags.no_shuffle,
                                            flags.seed);
  }
  const int64_t train_size = input->size();

  auto sgd = std::make_shared<torch::optim::SGD>(
      model->parameters(), torch::optim::SGDOptions(flags.lr).momentum(flags.momentum));

  // In-memory commits: on by default under elastic `dtrain run`, which provides the directory.
  auto commit_options = dtrain::commit_options_from_env(pg.get());
  int64_t commit_every = flags.commit_every;
  if (commit_every < 0) commit_every = commit_options && flags.strategy != "ps" ? 1 : 0;
  if (commit_every > 0 && !commit_options)
    throw dtrain::InvalidArgumentError(
        "--commit-every needs DTRAIN_COMMIT_DIR, a directory in memory that outlives the workers: "
        "elastic `dtrain run --max-restarts K` sets it; without it, use --checkpoint-dir");
  if (commit_every > 0 && flags.strategy == "ps")
    throw dtrain::InvalidArgumentError(
        "--commit-every with --strategy ps: the parameters live on the servers; checkpoint them "
        "there (dtrain ps-server --checkpoint-dir, DTRAIN_PS_CHECKPOINT_DIR)");

  // Resume (collective): the ranks agree on the newest state any of them holds (a disk
  // checkpoint or a node's in-memory commit); the lowest rank holding it loads it and sends it
  // to the others, before DDP or the distributed optimizer start from rank 0's weights.
  std::unique_ptr<dtrain::CheckpointManager> ckpt;
  std::unique_ptr<dtrain::CheckpointManager> commits;
  dtrain::TrainingProgress position;  // where training starts (or stands, once it runs)
  // The parameters and momentum are copied by the writing thread while the next step's forward
  // and backward passes run; the step waits for the copy before its optimizer step changes them.
  // (A parameter server's worker pulls new parameters outside the optimizer step.)
  const bool copy_in_background = flags.strategy != "ps";
  // Under --live the group changes: take_state() makes the manager again for each new world (its
  // rank 0 writes); a replacement makes its first there.
  auto make_checkpoints = [&] {
    dtrain::CheckpointOptions co;
    co.dir = flags.checkpoint_dir;
    co.keep = flags.keep_checkpoints;
    co.copy_in_background = copy_in_background;
    ckpt = std::make_unique<dtrain::CheckpointManager>(co, pg);
  };
  if (!flags.checkpoint_dir.empty() && !(live && live->replacement())) make_checkpoints();
  if (commit_every > 0) {
    commit_options->copy_in_background = copy_in_background;
    commits = std::make_unique<dtrain::CheckpointManager>(*commit_options, pg);
  }
  if (ckpt || commits) {
    if (auto resumed = dtrain::resume_newest(
            {{ckpt.get(), "checkpoint"}, {commits.get(), "in-memory commit"}}, *model, sgd.get(),
            pg.get())) {
      const auto* loaded = &resumed->checkpoint;
      position = loaded->progress;
      auto value = [&](const char* key) {
        auto it = position.values.find(key);
        return it == position.values.end() ? std::nan("") : it->second;
      };
      const double shards = input->from_shards() ? 1.0 : 0.0;
      if (position.epoch_size != train_size || value("seed") != static_cast<double>(flags.seed) ||
          value("shuffle") != (flags.no_shuffle ? 0.0 : 1.0) ||
          (std::isnan(value("shards")) ? 0.0 : value("shards")) != shards)
        throw dtrain::InvalidArgumentError(fmt::format(
            "{} was taken with {} training samples, seed {}, shuffle {}, shards {}; this run has "
            "{}, seed {}, shuffle {}, shards {}: its position in the epoch means nothing here. "
            "Resume with the same --train-samples, --seed, --no-shuffle and --data-shards, or use "
            "another --checkpoint-dir",
            loaded->path, position.epoch_size, value("seed"), value("shuffle"), value("shards"),
            train_size, flags.seed, flags.no_shuffle ? 0 : 1, shards));
      if (lead) {
        // The step reached before the failure is unknown here; what may be trained again is
        // bounded by the interval of the kind resumed from.
        const int64_t interval = resumed->kind == "in-memory commit" ? commit_every : flags.checkpoint_every;
        const std::string what = fmt::format(
            "from {} (epoch {}, step {}, {} of {} samples of the epoch done, saved at world size "
            "{}): {}, loaded by rank {}; the steps after {} are trained again ({})",
            loaded->path, position.epoch, position.step, position.epoch_consumed,
            position.epoch_size, position.world_size, resumed->kind, resumed->root, position.step,
            interval > 0 ? fmt::format("at most {}", interval) : "all since the last checkpoint");
        std::printf("resumed %s\n", what.c_str());
        std::fflush(stdout);
        dtrain::announce_resumed(rank, what);  // `dtrain run` reports it for the round
      }
    }
  }
  position.epoch_size = train_size;
  position.values["seed"] = static_cast<double>(flags.seed);
  position.values["shuffle"] = flags.no_shuffle ? 0.0 : 1.0;
  position.values["shards"] = input->from_shards() ? 1.0 : 0.0;
  std::unique_ptr<dtrain::DistributedDataParallel> ddp;
  std::unique_ptr<dtrain::DistributedOptimizer> dopt;
  std::unique_ptr<dtrain::ParameterServerTrainer> ps;
  std::shared_ptr<dtrain::ps::Client> ps_client;
  dtrain::ps::TableOptions ps_tables;  // what the servers make the tables with
  if (flags.strategy == "ps") {
    // The servers hold the parameters and run SGD with momentum; every worker starts from the
    // values the first one created the tables with.
    if (ckpt)
      throw dtrain::InvalidArgumentError(
          "--checkpoint-dir with --strategy ps: the parameters live on the servers; checkpoint "
          "them there (dtrain ps-server --checkpoint-dir, DTRAIN_PS_CHECKPOINT_DIR)");
    ps_tables.optimizer.kind = flags.momentum > 0 ? dtrain::ps::OptimizerOptions::Kind::kMomentum
                                                  : dtrain::ps::OptimizerOptions::Kind::kSgd;
    ps_tables.optimizer.lr = static_cast<float>(flags.lr);
    ps_tables.optimizer.momentum = static_cast<float>(flags.momentum);
    ps_tables.consistency = flags.ps_mode == "sync"    ? dtrain::ps::Consistency::kSync
                            : flags.ps_mode == "async" ? dtrain::ps::Consistency::kAsync
                                                       : dtrain::ps::Consistency::kBounded;
    ps_tables.staleness = flags.staleness;
    ps_client = dtrain::ps::Client::from_env();
    ps = std::make_unique<dtrain::ParameterServerTrainer>(*model, ps_client, ps_tables);
  } else if (pg && flags.strategy == "ddp" && !(live && live->replacement())) {
    // (A replacement makes its DDP with the state it receives: see take_state below.)
    ddp = std::make_unique<dtrain::DistributedDataParallel>(model.ptr(), pg, ddp_options_of(flags));
  } else if (pg && flags.strategy == "optimizer" && !(live && live->replacement())) {
    dtrain::broadcast_parameters(*model, *pg, 0);
    dopt = std::make_unique<dtrain::DistributedOptimizer>(sgd, *model, pg);
  }

  // Under live recovery the world's size changes; --on-resize says what follows from it.
  int64_t batch_size = flags.batch_size;
  auto steps_for = [&](size_t samples) {
    return (static_cast<int64_t>(samples) + batch_size - 1) / batch_size;
  };
  const int64_t per_epoch = steps_for(input->num_samples());
  // Steps to go: the rest of the (resumed) epoch, then whole epochs.
  input->set_epoch(static_cast<uint64_t>(position.epoch), static_cast<uint64_t>(position.epoch_consumed));
  int64_t total = position.step;
  if (position.epoch < flags.epochs)
    total += steps_for(input->num_samples()) + per_epoch * (flags.epochs - position.epoch - 1);
  if (flags.max_steps > 0) total = std::min(total, flags.max_steps);
  Progress progress(lead, total);
  SampleLog sample_log(flags.sample_log);

  model->train();
  int64_t step = position.step;
  int64_t steps_here = 0;  // by this process (the rest were restored)
  int64_t saved_step = position.step;
  bool stopped = false, preempted = false;
  // With somewhere to save to, a preemption warning stops the ranks together at a step (not with
  // a parameter server, whose asynchronous workers do not take steps together).
  std::unique_ptr<dtrain::Preemption> preemption;
  // (Not under --live: its agreement belongs to the first group.)
  if (ckpt && pg && !live && flags.strategy != "ps")
    preemption = std::make_unique<dtrain::Preemption>(pg);
  int64_t images = 0;      // of all ranks, assuming they keep in step (for the progress line)
  int64_t own_images = 0;  // of this rank
  auto restored = [&](const char* key) {
    auto it = position.values.find(key);
    return it == position.values.end() ? 0.0 : it->second;
  };
  double initial_loss = restored("initial_loss");
  std::deque<double> recent;  // losses of the last steps, for final_loss
  auto mean_recent = [&] {
    double sum = 0;
    for (double l : recent) sum += l;
    return recent.empty() ? restored("final_loss") : sum / static_cast<double>(recent.size());
  };
  auto checkpoint = [&] {
    position.step = step;
    position.values["initial_loss"] = initial_loss;
    position.values["final_loss"] = mean_recent();
    ckpt->save(*model, sgd.get(), position);
    saved_step = step;
  };
  // A failed commit (e.g. /dev/shm full) must not end training: the disk checkpoints remain.
  auto commits_failed = [&](const std::exception& e) {
    std::fprintf(stderr, "rank %d: in-memory commits stop: %s; resuming after a failure falls "
                 "back to the disk checkpoints\n", rank, e.what());
    commits.reset();
  };
  auto commit = [&] {
    position.step = step;
    position.values["initial_loss"] = initial_loss;
    position.values["final_loss"] = mean_recent();
    try {
      commits->save(*model, sgd.get(), position);
    } catch (const std::exception& e) {
      commits_failed(e);
    }
  };
  // Steps, samples/s and compute against communication for `dtrain run --metrics-port`.
  dtrain::ProgressReporter reporter(rank);
  reporter.step(step, 0);  // starts the clock
  const auto start = Clock::now();
  // Live recovery (dtrain run --live): after a peer's death the survivors re-form the world, go
  // on from the newest step any of them finished (its holder sends model and optimizer state to
  // the others) and deal the rest of the epoch over the new world: the step in progress is redone.
  auto regroup = [&](const std::string& failure) {
    if (lead || rank == 1)
      std::fprintf(stderr, "rank %d: a peer is gone (%s); re-forming the world\n", rank,
                   failure.c_str());
    if (live->original_rank() == flags.late_rank)  // stopped or cut off meanwhile, on purpose
      std::this_thread::sleep_for(std::chrono::milliseconds(flags.late_ms));
    const auto reformed = live->reform();
    pg = reformed.group;
    rank = pg->rank();
    world = pg->size();
    lead = rank == 0;
    // The parameter servers stop waiting for the lost workers and drop the step in progress,
    // which the survivors redo. Every survivor says so after its own pushes (on the same
    // connections), and take_state's all-reduce keeps anyone from pushing again before all have.
    if (ps_client)
      for (int lost : reformed.lost) ps_client->forget_worker(lost);
    return reformed;
  };
  // What a change of the world's size does to the batch and the learning rate (--on-resize).
  const dtrain::OnResize on_resize = dtrain::parse_on_resize(flags.on_resize);
  auto resize = [&](int now) {
    const dtrain::StepShape shape = dtrain::step_shape(
        on_resize, {.batch_per_rank = flags.batch_size, .learning_rate = flags.lr},
        live->size_at_start(), now);
    batch_size = shape.batch_per_rank;
    for (auto& group : sgd->param_groups())
      static_cast<torch::optim::SGDOptions&>(group.options()).lr(shape.learning_rate);
  };
  auto resized = [&] {
    return fmt::format(
        "batch {} per rank, learning rate {:g}", batch_size,
        static_cast<torch::optim::SGDOptions&>(sgd->param_groups()[0].options()).lr());
  };
  // After the world changed (a re-forming, or replacements taken in): every member goes on from
  // the newest step any of them finished; its lowest holder sends parameters, optimizer state and
  // the epoch's position (the parameters then checked by digest on every member), DDP (or the
  // distributed optimizer) is made on the new group and the rest of the epoch dealt over it.
  auto take_state = [&] {
    ddp.reset();
    dopt.reset();  // its coordinator runs on the old world's group: every member stops it here
    // The checkpoint in flight is finished (and its copy made) before the state changes; the
    // all-reduce below keeps the new writer from clearing the directory before then.
    ckpt.reset();
    // The members at the newest step hold the state; the others (a replacement, a survivor a
    // step behind) take it from them, a piece from each.
    std::vector<int64_t> mine = {step}, steps(static_cast<size_t>(world));
    pg->allgather(dtrain::TensorView::of(steps), dtrain::TensorView::of(mine))->wait();
    if (!flags.checkpoint_dir.empty()) make_checkpoints();
    const int64_t newest = *std::max_element(steps.begin(), steps.end());
    std::vector<int> holders;
    for (int r = 0; r < world; ++r)
      if (steps[static_cast<size_t>(r)] == newest) holders.push_back(r);
    if (ps) {
      ps->pull();  // the servers hold parameters and momentum
    } else {
      dtrain::share_parameters(*model, *pg, holders);
      dtrain::share_optimizer_state(*sgd, *pg, holders);
    }
    std::vector<int64_t> at = {position.epoch, position.epoch_consumed, step};
    dtrain::BroadcastOptions from;
    from.root = holders.front();
    pg->broadcast(dtrain::TensorView::of(at), from)->wait();
    position.epoch = at[0];
    position.epoch_consumed = at[1];
    step = at[2];
    if (flags.strategy == "optimizer") {
      dtrain::check_same_parameters(*model, *pg);  // a newcomer takes part with the same bits
      dopt = std::make_unique<dtrain::DistributedOptimizer>(sgd, *model, pg);
    } else if (!ps) {
      dtrain::check_same_parameters(*model, *pg);
      ddp = std::make_unique<dtrain::DistributedDataParallel>(model.ptr(), pg,
                                                              ddp_options_of(flags));
    }
    resize(world);
    input->regroup(world, rank, !flags.no_shuffle, flags.seed);
    input->set_epoch(static_cast<uint64_t>(position.epoch),
                     static_cast<uint64_t>(position.epoch_consumed));
    total = step + steps_for(input->num_samples()) +
            steps_for(static_cast<size_t>((train_size + world - 1) / world)) *
                std::max<int64_t>(0, flags.epochs - position.epoch - 1);
    if (flags.max_steps > 0) total = std::min(total, flags.max_steps);
    sample_log.set_attempt(live->generation());
  };
  auto recover = [&](const std::string& failure) {
    const auto reformed = regroup(failure);
    // Left out (it came after the others closed the list) and taken in again: this rank's state
    // is stale, and never the one to go on from.
    if (reformed.rejoined) {
      step = -1;
      // The servers forgot this worker when the others left it out: its connections no longer
      // speak for it. It connects anew, as a replacement does.
      if (ps) {
        ps.reset();
        ps_client = dtrain::ps::Client::from_env();
        ps = std::make_unique<dtrain::ParameterServerTrainer>(*model, ps_client, ps_tables);
      }
    }
    take_state();
    if (lead)
      std::printf("live world: generation %d of %d rank(s) formed in %.2f s, going on from step "
                  "%lld (lost rank(s) %s at start; %s)\n",
                  live->generation(), world, reformed.seconds, static_cast<long long>(step),
                  fmt::format("{}", fmt::join(reformed.lost, ", ")).c_str(), resized().c_str());
  };
  // At a step boundary: replacements for lost ranks (dtrain run --live --replace) taken in.
  auto admit = [&] {
    auto grown = live->admit_waiting();
    if (!grown) return false;
    pg = grown->group;
    rank = pg->rank();
    world = pg->size();
    lead = rank == 0;
    take_state();
    if (lead)
      std::printf("live world: generation %d of %d rank(s) formed in %.2f s, taking in rank(s) "
                  "%s at start, going on from step %lld (%s)\n",
                  live->generation(), world, grown->seconds,
                  fmt::format("{}", fmt::join(grown->joined, ", ")).c_str(),
                  static_cast<long long>(step), resized().c_str());
    return true;
  };
  if (live && live->replacement()) {
    take_state();
    std::printf("rank %d at start, a replacement: rank %d of %d in generation %d, going on from "
                "step %lld with the state the others sent\n",
                live->original_rank(), rank, world, live->generation(),
                static_cast<long long>(step));
  }
  int64_t epoch = position.epoch;
  bool resuming = true;  // the first epoch (or one a re-forming cut) starts at `position`
  while (epoch < flags.epochs && step < total && !stopped) {
    input->set_epoch(static_cast<uint64_t>(epoch),
                     resuming ? static_cast<uint64_t>(position.epoch_consumed) : 0);
    resuming = false;
    const size_t samples = input->num_samples();
    std::vector<int64_t> batch;
    torch::Tensor x, y;
    bool reformed = false;
    for (size_t from = 0; from < samples && step < total; from += batch_size) {
      if (live) {  // replacements join between steps
        bool grown = false;
        try {
          grown = admit();
        } catch (const std::exception& e) {
          if (!dtrain::LiveWorld::peer_lost(e)) throw;
          recover(e.what());
          grown = true;
        }
        if (grown) {
          reformed = true;
          break;
        }
      }
      size_t end = std::min(samples, from + static_cast<size_t>(batch_size));
      size_t padding = 0;
      input->next(end - from, x, y, batch, padding);
      x = x.to(device);
      y = y.to(device);

      if (rank == flags.straggler_rank)  // a slow worker, on purpose (--straggler-ms)
        std::this_thread::sleep_for(std::chrono::milliseconds(flags.straggler_ms));
      double l = 0;
      try {
        sgd->zero_grad();
        auto out = ddp ? ddp->forward([&] { return model->forward(x); }) : model->forward(x);
        auto loss = torch::nn::functional::cross_entropy(out, y);
        // The rest of an epoch dealt over a world that does not divide it is padded with samples
        // trained already: under live recovery they get no weight, so none is trained twice.
        if (live && padding > 0) {
          namespace F = torch::nn::functional;
          auto each =
              F::cross_entropy(out, y, F::CrossEntropyFuncOptions().reduction(torch::kNone));
          const auto real = static_cast<int64_t>(batch.size() - padding);
          loss = each.slice(0, 0, real).sum() / static_cast<double>(std::max<int64_t>(1, real));
        }
        // The previous step's commit is complete before this rank's gradients of this step go out:
        // no rank can finish a step whose predecessor is not committed, so a failure costs the
        // step in progress and at most the one before it (with --commit-every 1). The write
        // (tmpfs) is long done by now.
        if (commits) {
          try {
            commits->wait();
          } catch (const std::exception& e) {
            commits_failed(e);
          }
        }
        // Logged before this rank's gradients leave: a step can be committed (by another rank)
        // once they have, even if this rank dies right after. A step logged but never finished
        // is trained again after the restart, whose lines supersede these.
        // (Without weight, padding is not trained: not logged.)
        const size_t trained = live ? batch.size() - padding : batch.size();
        sample_log.record(epoch, step + 1,
                          std::vector<int64_t>(batch.begin(), batch.begin() + trained));
        loss.backward();
        if (ckpt) ckpt->wait_copied();
        {
          dtrain::TimelineSpan span("optimizer step", "compute");
          if (ps) {
            ps->step();
          } else if (dopt) {
            dopt->step();
          } else {
            sgd->step();
          }
        }
        l = loss.item<double>();
        if (step == 0) initial_loss = allreduce_mean(pg.get(), l);  // kept in checkpoints
      } catch (const std::exception& e) {
        if (!live || !dtrain::LiveWorld::peer_lost(e)) throw;
        recover(e.what());
        reformed = true;
        break;
      }
      recent.push_back(l);
      if (recent.size() > 20) recent.pop_front();
      ++step;
      ++steps_here;
      images += static_cast<int64_t>(batch.size()) * world;
      own_images += static_cast<int64_t>(batch.size());
      reporter.step(step, static_cast<int64_t>(batch.size()));
      // Where a run resumed from here starts: after this batch, or at the next epoch.
      const bool epoch_done = end >= samples;
      position.epoch = epoch_done ? epoch + 1 : epoch;
      position.epoch_consumed = epoch_done ? 0 : static_cast<int64_t>(input->consumed(end));
      stopped = flags.stop_after_steps > 0 && step == flags.stop_after_steps;
      preempted = preemption && preemption->should_stop();
      stopped = stopped || preempted;
      if (ckpt && (stopped || (flags.checkpoint_every > 0 && step % flags.checkpoint_every == 0)))
        checkpoint();
      if (commits && step % commit_every == 0) commit();
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      progress.update(step, static_cast<int>(epoch), l, images / elapsed,
                      elapsed / steps_here * (total - step), step == total || epoch_done);
      if (stopped) break;
    }
    if (reformed) {
      epoch = position.epoch;
      resuming = true;
      continue;
    }
    ++epoch;
  }
  if (live) live->close();  // replacements still waiting have nothing to join
  if (ckpt && step != saved_step) checkpoint();  // the end of training
  if (ckpt) {
    ckpt->wait();  // durable before we report; rethrows a failed write
    const auto st = ckpt->stats();
    if (lead && st.saves > 0)
      std::printf("checkpoints: %d written to %s, %.2f MB each; per save %.2f ms on the training "
                  "thread (copying) + %.2f ms waiting for the writing thread; %.1f ms copying "
                  "and %.1f ms writing in the background\n",
                  st.saves, ckpt->dir().c_str(), st.bytes / 1e6, st.total_snapshot_ms / st.saves,
                  st.total_blocked_ms / st.saves, st.total_copy_ms / st.saves,
                  st.total_write_ms / st.saves);
  }
  if (commits) {
    try {
      commits->wait();
      const auto st = commits->stats();
      if (lead && st.saves > 0)
        std::printf("commits: %d written to %s, %.2f MB each; per commit %.2f ms on the training "
                    "thread (copying) + %.2f ms waiting for the writing thread; %.2f ms copying "
                    "and %.2f ms writing in the background\n",
                    st.saves, commits->dir().c_str(), st.bytes / 1e6, st.total_snapshot_ms / st.saves,
                    st.total_blocked_ms / st.saves, st.total_copy_ms / st.saves,
                    st.total_write_ms / st.saves);
    } catch (const std::exception& e) {
      commits_failed(e);
    }
  }
  if (stopped) {
    if (lead)
      std::printf("stopped after step %lld (%s)%s\n", static_cast<long long>(step),
                  preempted ? "preempted: run again to resume" : "--stop-after-steps",
                  ckpt ? fmt::format("; checkpoint {}", dtrain::checkpoint_path(ckpt->dir(), step)).c_str()
                       : "");
    std::fflush(stdout);
    dopt.reset();  // collective: every rank stops its coordinator together
    if (preempted) return preemption->requeue();  // 75 once every rank is done
    if (pg) pg->barrier()->wait();
    return 0;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // Every rank's own rate, added up: ranks that do not keep in step (an asynchronous parameter
  // server with a straggler) are counted for what each did.
  // Every rank names the bad records it replaced; the total goes into RESULT.
  for (const auto& why : input->skipped())
    std::fprintf(stderr, "rank %d: trained without a bad record: %s\n", rank, why.c_str());
  if (ps) ps->pull();  // the servers' latest values
  double images_per_sec = 0, final_loss = 0, input_wait_ms = 0, test_loss = 0;
  int64_t bad_records = 0, correct = 0, seen = 0;
  // Under live recovery a rank may die here too: the survivors re-form and sum up again.
  for (bool summed = false; !summed;) {
    try {
      images_per_sec =
          allreduce_mean(pg.get(), static_cast<double>(own_images) / seconds) * world;
      final_loss = allreduce_mean(pg.get(), mean_recent());
      input_wait_ms = allreduce_mean(
          pg.get(), input->waited_seconds() * 1e3 / std::max<int64_t>(1, steps_here));
      bad_records = allreduce_sum(pg.get(), static_cast<int64_t>(input->skipped().size()));

      // Test accuracy and loss: every rank scores its share of the test set with rank 0's batch
      // statistics.
      if (pg) dtrain::broadcast_parameters(*model, *pg, 0);
      model->eval();
      correct = 0;
      seen = 0;
      test_loss = 0;
      {
        torch::NoGradGuard no_grad;
        auto shard = torch::arange(rank, test.size(), world, torch::kLong);
        for (int64_t at = 0; at < shard.size(0); at += 1000) {
          auto idx = shard.slice(0, at, std::min(shard.size(0), at + 1000));
          auto logits = model->forward(test.images.index_select(0, idx).to(device));
          auto labels = test.labels.index_select(0, idx).to(device);
          correct += logits.argmax(1).eq(labels).sum().item<int64_t>();
          test_loss += torch::nn::functional::cross_entropy(
                           logits, labels,
                           torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                           .item<double>();
          seen += idx.size(0);
        }
      }
      correct = allreduce_sum(pg.get(), correct);
      seen = allreduce_sum(pg.get(), seen);
      test_loss = allreduce(pg.get(), test_loss, dtrain::ReduceOp::kSum);
      summed = true;
    } catch (const std::exception& e) {
      if (!live || !dtrain::LiveWorld::peer_lost(e)) throw;
      dopt.reset();  // on the group that failed
      regroup(e.what());
    }
  }
  const double accuracy = static_cast<double>(correct) / std::max<int64_t>(1, seen);

  if (lead) {
    if (!flags.save.empty()) dtrain::save_module_state(*model, flags.save);
    std::printf("test accuracy %.4f (%lld/%lld), %.1f s, %.0f images/s\n", accuracy,
                static_cast<long long>(correct), static_cast<long long>(seen), seconds,
                images_per_sec);
    nlohmann::ordered_json result = {
        {"strategy", world > 1 || ps ? flags.strategy : "single"},
        {"world_size", world},
        {"epochs", flags.epochs},
        {"steps", step},
        {"images_per_sec", images_per_sec},
        {"initial_loss", initial_loss},
        {"final_loss", final_loss},
        {"test_accuracy", accuracy},
        {"eval_loss", test_loss / static_cast<double>(std::max<int64_t>(1, seen))},
        {"device", device.str()},
    };
    // With --data-shards: the time a step waited for its images, on average over the ranks,
    // and the bad records the job trained without (--skip-bad-records).
    if (input->from_shards()) {
      result["input_wait_ms_per_step"] = input_wait_ms;
      result["bad_records_skipped"] = bad_records;
    }
    std::printf("RESULT %s\n", result.dump().c_str());
    std::fflush(stdout);
  }
  dopt.reset();  // collective: every rank stops its coordinator together
  if (pg) pg->barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train the Fashion-MNIST ConvNet, data parallel over the ranks of a dtrain job"};
  app.option_defaults()->always_capture_default();  // --help shows every default
  Flags flags;
  app.add_option("--strategy", flags.strategy,
                 "ddp, optimizer (Horovod-style) or ps (parameter server: dtrain run --servers)")
      ->check(CLI::IsMember({"ddp", "optimizer", "ps"}));
  app.add_option("--device", flags.device,
                 "where to train: cpu, cuda (this rank's GPU: LOCAL_RANK modulo the GPUs "
                 "visible) or cuda:N");
  app.add_option("--comm-hook", flags.comm_hook,
                 "ddp: how gradients travel: allreduce (exact), fp16, bf16, int8 or int4 (a scale "
                 "per 256 values; all four with error feedback on the native backend)")
      ->check(CLI::IsMember({"allreduce", "fp16", "bf16", "int8", "int4"}));
  app.add_option("--ps-mode", flags.ps_mode, "parameter server consistency: sync, async or ssp")
      ->check(CLI::IsMember({"sync", "async", "ssp"}));
  app.add_option("--staleness", flags.staleness, "ssp: steps a worker may run ahead of the slowest");
  app.add_option("--straggler-rank", flags.straggler_rank, "benchmark: this rank sleeps every step");
  app.add_option("--straggler-ms", flags.straggler_ms, "benchmark: how long the straggler sleeps");
  app.add_option("--epochs", flags.epochs, "passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", flags.batch_size, "images per step on each rank")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", flags.lr, "SGD learning rate");
  app.add_option("--on-resize", flags.on_resize,
                 "under dtrain run --live, when the world shrinks or grows: keep-rank-batch "
                 "(torchft's way: the global batch follows the world), scale-lr (Horovod's "
                 "elastic examples: the learning rate follows the world) or keep-global-batch "
                 "(each rank's batch grows as the world shrinks; include/dtrain/step_shape.h)")
      ->check(CLI::IsMember({"keep-rank-batch", "scale-lr", "keep-global-batch"}));
  app.add_option("--momentum", flags.momentum, "SGD momentum");
  app.add_option("--seed", flags.seed, "initial weights and shuffling");
  app.add_option("--threads", flags.threads, "LibTorch threads per rank (0 = the CPUs it is bound to, else cores / local ranks)");
  app.add_option("--max-steps", flags.max_steps, "stop after this many steps (0 = no limit)");
  app.add_flag("--no-shuffle", flags.no_shuffle, "visit the samples in order");
  app.add_option("--init", flags.init, "initial model state (safetensors)");
  app.add_option("--save", flags.save, "write the trained model state (safetensors, rank 0)");
  app.add_option("--data", flags.data, "folder with the Fashion-MNIST *-ubyte.gz files");
  app.add_option("--data-shards", flags.data_shards,
                 "train from TFRecord shards (a glob or @manifest) written by `dtrain data write "
                 "--fashion-mnist`, read by background threads; the test set still comes from --data");
  app.add_option("--readers", flags.readers, "with --data-shards: reader threads per rank")
      ->check(CLI::Range(1, 64));
  app.add_flag("--skip-bad-records", flags.skip_bad_records,
               "with --data-shards: train without damaged records (each replaced by another, "
               "named at the end, counted in RESULT) instead of failing");
  app.add_option("--checkpoint-dir", flags.checkpoint_dir,
                 "save checkpoints here (rank 0) and resume from the newest good one");
  app.add_option("--checkpoint-every", flags.checkpoint_every,
                 "steps between checkpoints (0 = only at the end)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--keep-checkpoints", flags.keep_checkpoints, "newest checkpoints kept")
      ->check(CLI::PositiveNumber);
  app.add_option("--commit-every", flags.commit_every,
                 "steps between in-memory commits to DTRAIN_COMMIT_DIR (set by elastic dtrain "
                 "run; default 1 there, else off; 0 = off)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--deterministic", flags.deterministic,
               "bit-reproducible: one thread unless --threads, deterministic kernels only");
  app.add_option("--sample-log", flags.sample_log,
                 "debug: append \"epoch index step restart\" for every sample trained (all ranks, "
                 "one file); `dtrain chaos` sets it through the environment")
      ->envname("DTRAIN_SAMPLE_LOG");
  app.add_option("--stop-after-steps", flags.stop_after_steps,
                 "debug: checkpoint and exit after this step, as a preempted job would")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--late-rank", flags.late_rank,
                 "debug: under --live, this rank (at start) re-forms --late-ms late after a failure");
  app.add_option("--late-ms", flags.late_ms)->check(CLI::NonNegativeNumber);
  app.add_option("--train-samples", flags.train_samples,
                 "train on the first N images only (0 = all)")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_fashion_mnist: %s\n", e.what());
    return 1;
  }
}
