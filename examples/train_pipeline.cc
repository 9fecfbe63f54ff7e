// train_pipeline: a deep MLP on Fashion-MNIST cut into pipeline stages, optionally replicated
// (stages x replicas = the ranks of the job).
//
//   build/bin/train_pipeline --epochs 1                                        # one process
//   build/bin/dtrain run -n 4 -- build/bin/train_pipeline --stages 4           # 4 stages
//   build/bin/dtrain run -n 4 -- build/bin/train_pipeline --stages 2 --schedule zb-h1
//                                                               # 2 stages x 2 replicas
//   build/bin/dtrain run -n 2 -- build/bin/train_pipeline --stages 2 --checkpoint-dir ckpt
//       --checkpoint-every 50           # (one line) run it again after a crash: it resumes
//   build/bin/dtrain run -n 2 -- build/bin/train_pipeline --device cuda    # stages on GPUs
//
// The model: Flatten, then --layers Linear layers of --hidden units with ReLU between them, cut
// into stages of about equal parameter counts (--balance time: of equal measured time). Each
// batch of --batch-size images per replica is cut into --microbatches micro-batches that the
// --schedule runs through the stages (dtrain pipeline-plan draws it). World rank 0 prints the
// stage each rank holds, progress lines (from the last stage), the test accuracy, and last one
// machine-readable line:
//   RESULT {"strategy":"pipeline","world_size":4,"stages":2,"replicas":2,"schedule":"1f1b",
//           "microbatches":4,"steps":...,"images_per_sec":...,"initial_loss":...,
//           "final_loss":...,"test_accuracy":...,"peak_microbatches":[...],
//           "stage_parameters":[...],"training_memory_mib":[...],"step_ms":...,
//           "compute_ms_per_step":...,"parameter_sum":...}
// training_memory_mib: per stage, the most heap its training thread held at once (activations
// the schedule keeps, gradients, optimizer state; jemalloc's thread.peak, -1 without jemalloc).
// parameter_sum is the sum of every parameter of the model, in double: a resumed run and one
// that never stopped end with the same value (exact resume). For tests: --stop-after-steps N
// checkpoints and exits after step N, --train-samples N trains on the first N images only.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <numeric>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "dtrain/dtrain.h"
#include "dtrain/torch/device.h"
#include "dtrain/torch/distributed_sampler.h"
#include "dtrain/torch/fashion_mnist.h"
#include "dtrain/torch/pipeline.h"
#include "dtrain/torch/pipeline_checkpoint.h"
#include "dtrain/torch/runtime.h"
#include "dtrain/torch/tensor_view.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string device = "cpu";  // cpu, cuda (this rank's GPU) or cuda:N
  int stages = 0;              // 0 = the world size (no replicas)
  std::string schedule = "1f1b";
  int microbatches = 4;
  int virtual_stages = 1;
  std::string balance = "parameters";
  int layers = 8;
  int hidden = 256;
  int epochs = 1;
  int batch_size = 64;
  double lr = 0.05;
  double momentum = 0.9;
  uint64_t seed = 0;
  std::string data = dtrain::kFashionMnistDir;
  int64_t train_samples = 0;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 100;
  int keep_checkpoints = 3;
  int64_t stop_after_steps = 0;
  int threads = 0;
};

bool launched_distributed() {
  return std::getenv("WORLD_SIZE") != nullptr || std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
         std::getenv("PMI_SIZE") != nullptr || std::getenv("SLURM_NTASKS") != nullptr;
}

torch::nn::Sequential make_model(const Flags& f) {
  torch::nn::Sequential model;
  model->push_back(torch::nn::Flatten());
  int64_t in = 28 * 28;
  for (int i = 0; i < f.layers; ++i) {
    const int64_t out = i + 1 == f.layers ? 10 : f.hidden;
    torch::nn::Linear linear(in, out);
    // He initialisation: LibTorch's default shrinks a deep ReLU stack's signal layer by layer.
    torch::nn::init::kaiming_normal_(linear->weight, 0, torch::kFanIn, torch::kReLU);
    torch::nn::init::zeros_(linear->bias);
    model->push_back(linear);
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
double allreduce_max(dtrain::ProcessGroup& g, double v) {
  auto t = torch::tensor({v}, torch::kDouble);
  g.allreduce(dtrain::view_of(t), {.op = dtrain::ReduceOp::kMax})->wait();
  return t.item<double>();
}

int run(const Flags& flags) {
  // First of all: a GPU asked for and not usable fails here, before any rank waits for another.
  const at::Device device = dtrain::training_device(flags.device);
  const auto runtime = dtrain::configure_runtime(flags.threads);
  std::string store_file;
  std::shared_ptr<dtrain::ProcessGroup> world;
  if (launched_distributed()) {
    world = dtrain::init_process_group();
  } else {  // one process: a group of one over a file store
    store_file = fmt::format("{}/dtrain-train-pipeline-{}",
                             std::filesystem::temp_directory_path().string(), ::getpid());
    dtrain::InitOptions o;
    o.identity.rank = 0;
    o.identity.world_size = 1;
    o.identity.init_method = "file://" + store_file;
    world = dtrain::init_process_group(o);
  }
  const int stages = flags.stages > 0 ? flags.stages : world->size();
  dtrain::ParallelLayout layout(world, {.pipeline_stages = stages});
  const bool lead = world->rank() == 0;

  torch::manual_seed(flags.seed);  // the same model on every rank; each keeps its stages
  auto model = make_model(flags);
  auto test = dtrain::load_fashion_mnist(flags.data, /*train=*/false);
  auto train = dtrain::load_fashion_mnist(flags.data, /*train=*/true);
  if (flags.train_samples > 0 && flags.train_samples < train.size()) {
    train.images = train.images.slice(0, 0, flags.train_samples);
    train.labels = train.labels.slice(0, 0, flags.train_samples);
  }
  const int parts = stages * flags.virtual_stages;
  const auto cuts = flags.balance == "time"
                        ? dtrain::balance_by_time(model, parts, train.images.slice(0, 0, flags.batch_size),
                                                  5, world.get())
                        : dtrain::balance_by_parameters(model, parts);
  // This rank's stages, registered in one module: what the optimizer steps and checkpoints hold.
  std::vector<torch::nn::Sequential> mine;
  auto held = std::make_shared<torch::nn::Module>();
  std::vector<int> my_stage_ids;
  for (int s = layout.stage(); s < parts; s += stages) {
    mine.push_back(dtrain::slice(model, cuts[s], cuts[s + 1]));
    mine.back()->to(device);  // the pipeline moves what the stage receives there
    held->register_module(fmt::format("stage{}", s), mine.back());
    my_stage_ids.push_back(s);
  }
  dtrain::Pipeline pipe(mine, layout.pipeline_group(),
                        {.schedule = flags.schedule,
                         .microbatches = flags.microbatches,
                         .virtual_stages = flags.virtual_stages},
                        layout.data_group());
  auto sgd = std::make_shared<torch::optim::SGD>(
      pipe.parameters(), torch::optim::SGDOptions(flags.lr).momentum(flags.momentum));

  int64_t my_params = 0;
  for (const auto& p : pipe.parameters()) my_params += p.numel();
  // Parameters per pipeline rank, for RESULT (replica 0 of each rank reports).
  auto per_stage = torch::zeros({stages}, torch::kLong);
  if (layout.replica() == 0) per_stage[layout.stage()] = my_params;
  world->allreduce(dtrain::view_of(per_stage))->wait();
  if (lead)
    std::printf("train_pipeline: %d rank(s) = %d stage(s) x %d replica(s), schedule %s, %d "
                "micro-batches of a batch of %d per replica, %d thread(s)\n",
                world->size(), stages, layout.replicas(), flags.schedule.c_str(),
                flags.microbatches, flags.batch_size, runtime.threads);
  std::fprintf(stderr, "rank %d: %s, stage(s) %s, modules %s, %lld parameters\n", world->rank(),
               layout.describe().c_str(), fmt::format("{}", fmt::join(my_stage_ids, ",")).c_str(),
               fmt::format("[{}, {})", cuts[my_stage_ids.front()], cuts[my_stage_ids.front() + 1]).c_str(),
               static_cast<long long>(my_params));

  dtrain::DistributedSampler sampler(static_cast<size_t>(train.size()), layout.replicas(),
                                     layout.replica(), /*shuffle=*/true, flags.seed);
  std::unique_ptr<dtrain::PipelineCheckpoint> ckpt;
  dtrain::TrainingProgress at;
  if (!flags.checkpoint_dir.empty()) {
    ckpt = std::make_unique<dtrain::PipelineCheckpoint>(
        dtrain::CheckpointOptions{.dir = flags.checkpoint_dir, .keep = flags.keep_checkpoints},
        layout);
    if (auto loaded = ckpt->load_latest(*held, sgd.get())) {
      at = loaded->progress;
      if (lead) {
        const std::string what =
            fmt::format("from {} (epoch {}, step {}, {} samples of the epoch done)", loaded->path,
                        at.epoch, at.step, at.epoch_consumed);
        std::printf("resumed %s\n", what.c_str());
        dtrain::announce_resumed(world->rank(), what);  // `dtrain run` reports it for the round
      }
    }
  }

  const bool reporter = pipe.holds_last_stage() && layout.replica() == 0;
  // Memory: the most heap training held at once on this rank's training thread (activations the
  // schedule keeps, gradients, optimizer state), over what was allocated before it; jemalloc
  // only (-1 otherwise).
  dtrain::reset_thread_peak_memory();
  std::deque<double> recent;
  double initial_loss = -1;
  int64_t step = at.step, steps_here = 0, images = 0;
  double compute_ms = 0, step_ms = 0;
  int peak = 0;
  bool stopped = false;
  const auto start = Clock::now();
  auto last_print = start;
  auto cross_entropy = [](const at::Tensor& out, const at::Tensor& y) {
    return torch::nn::functional::cross_entropy(out, y);
  };
  for (int64_t epoch = at.epoch; epoch < flags.epochs && !stopped; ++epoch) {
    sampler.set_epoch(static_cast<uint64_t>(epoch), epoch == at.epoch ? at.epoch_consumed : 0);
    while (auto indices = sampler.next(static_cast<size_t>(flags.batch_size))) {
      // The epoch's short tail is skipped, as by the Python example (torch's schedules there need
      // every step's micro-batches of one shape), so that the two train alike.
      if (static_cast<int>(indices->size()) < flags.batch_size) break;
      auto idx = torch::tensor(std::vector<int64_t>(indices->begin(), indices->end()), torch::kLong);
      sgd->zero_grad();
      at::Tensor loss = pipe.step(train.images.index_select(0, idx),
                                  train.labels.index_select(0, idx), cross_entropy);
      sgd->step();
      ++step;
      ++steps_here;
      images += static_cast<int64_t>(indices->size()) * layout.replicas();
      const auto st = pipe.stats();
      compute_ms += st.compute_ms;
      step_ms += st.step_ms;
      peak = std::max(peak, st.peak_microbatches);
      if (loss.defined()) {
        const double l = loss.item<double>();
        if (initial_loss < 0) initial_loss = l;
        recent.push_back(l);
        if (recent.size() > 20) recent.pop_front();
      }
      if (reporter && std::chrono::duration<double>(Clock::now() - last_print).count() > 2) {
        last_print = Clock::now();
        const double secs = std::chrono::duration<double>(last_print - start).count();
        std::printf("step %lld, epoch %lld, loss %.4f, %.0f images/s\n", static_cast<long long>(step),
                    static_cast<long long>(epoch), recent.back(), images / secs);
        std::fflush(stdout);
      }
      if (ckpt && (step % flags.checkpoint_every == 0 || step == flags.stop_after_steps)) {
        at.step = step;
        at.epoch = epoch;
        at.epoch_consumed = static_cast<int64_t>(sampler.consumed());
        at.epoch_size = train.size();
        ckpt->save(*held, sgd.get(), at);
      }
      if (flags.stop_after_steps > 0 && step >= flags.stop_after_steps) {
        stopped = true;
        break;
      }
    }
  }
  const int64_t peak_bytes = dtrain::thread_peak_memory();
  const double training_mib = peak_bytes < 0 ? -1.0 : peak_bytes / 1048576.0;
  if (ckpt) ckpt->wait();
  if (stopped) {
    if (lead) std::printf("stopped after step %lld (--stop-after-steps)\n", static_cast<long long>(step));
    world->barrier()->wait();
    return 0;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();

  // Test accuracy: each replica scores its share of the test set through its pipeline.
  int64_t correct = 0, seen = 0;
  auto share = torch::arange(layout.replica(), test.size(), layout.replicas(), torch::kLong);
  for (int64_t i = 0; i < share.size(0); i += 1000) {
    auto idx = share.slice(0, i, std::min(share.size(0), i + 1000));
    at::Tensor out = pipe.forward(test.images.index_select(0, idx));
    if (out.defined()) {
      correct +=
          out.argmax(1).eq(test.labels.index_select(0, idx).to(out.device())).sum().item<int64_t>();
      seen += idx.size(0);
    }
  }
  const double accuracy = allreduce_sum(*world, static_cast<double>(correct)) /
                          std::max(1.0, allreduce_sum(*world, static_cast<double>(seen)));
  // The figures known on the last stage go to rank 0 through sums over the job.
  const double mean_recent =
      recent.empty() ? 0 : std::accumulate(recent.begin(), recent.end(), 0.0) / recent.size();
  const double final_loss = allreduce_sum(*world, reporter ? mean_recent : 0);
  const double first_loss = allreduce_sum(*world, reporter ? initial_loss : 0);
  double sum = 0;
  if (layout.replica() == 0) {
    torch::NoGradGuard no_grad;
    for (const auto& p : pipe.parameters()) sum += p.to(torch::kDouble).sum().item<double>();
  }
  const double parameter_sum = allreduce_sum(*world, sum);
  auto peaks = torch::zeros({stages}, torch::kLong);
  auto growth = torch::zeros({stages}, torch::kDouble);
  if (layout.replica() == 0) {
    peaks[layout.stage()] = peak;
    growth[layout.stage()] = training_mib;
  }
  world->allreduce(dtrain::view_of(peaks))->wait();
  world->allreduce(dtrain::view_of(growth))->wait();
  const double images_per_sec = images / seconds;
  const double mean_step_ms = allreduce_max(*world, step_ms / std::max<int64_t>(1, steps_here));
  const double mean_compute_ms =
      allreduce_sum(*world, compute_ms / std::max<int64_t>(1, steps_here)) / world->size();

  if (lead) {
    std::printf("test accuracy %.4f, %.1f s, %.0f images/s\n", accuracy, seconds, images_per_sec);
    nlohmann::ordered_json result = {
        {"strategy", "pipeline"},
        {"world_size", world->size()},
        {"stages", stages},
        {"replicas", layout.replicas()},
        {"schedule", flags.schedule},
        {"microbatches", flags.microbatches},
        {"virtual_stages", flags.virtual_stages},
        {"epochs", flags.epochs},
        {"steps", step},
        {"images_per_sec", images_per_sec},
        {"initial_loss", first_loss},
        {"final_loss", final_loss},
        {"test_accuracy", accuracy},
        {"peak_microbatches", std::vector<int64_t>(peaks.data_ptr<int64_t>(),
                                                    peaks.data_ptr<int64_t>() + stages)},
        {"stage_parameters", std::vector<int64_t>(per_stage.data_ptr<int64_t>(),
                                                   per_stage.data_ptr<int64_t>() + stages)},
        {"training_memory_mib", std::vector<double>(growth.data_ptr<double>(),
                                                     growth.data_ptr<double>() + stages)},
        {"step_ms", mean_step_ms},
        {"compute_ms_per_step", mean_compute_ms},
        {"parameter_sum", parameter_sum},
        {"device", device.str()},
    };
    std::printf("RESULT %s\n", result.dump().c_str());
    std::fflush(stdout);
  }
  world->barrier()->wait();
  world.reset();
  if (!store_file.empty()) std::filesystem::remove(store_file);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a deep MLP on Fashion-MNIST, cut into pipeline stages (and replicated)"};
  app.option_defaults()->always_capture_default();
  Flags f;
  app.add_option("--device", f.device,
                 "where this rank's stages compute: cpu, cuda (this rank's GPU: LOCAL_RANK modulo "
                 "the GPUs visible) or cuda:N");
  app.add_option("--stages", f.stages, "Pipeline stages; the ranks are stages x replicas (0 = all ranks)")
      ->check(CLI::Range(0, 4096));
  std::string names;
  for (const auto& s : dtrain::pipeline::registered_schedules()) names += " " + s.name;
  app.add_option("--schedule", f.schedule, "Pipeline schedule:" + names);
  app.add_option("--microbatches", f.microbatches, "Micro-batches per batch")->check(CLI::Range(1, 1 << 16));
  app.add_option("--virtual-stages", f.virtual_stages, "Stages per rank (interleaved-1f1b)")
      ->check(CLI::Range(1, 64));
  app.add_option("--balance", f.balance, "Cut the model by parameters or by measured time")
      ->check(CLI::IsMember({"parameters", "time"}));
  app.add_option("--layers", f.layers, "Linear layers")->check(CLI::Range(1, 1024));
  app.add_option("--hidden", f.hidden, "Units of each hidden layer")->check(CLI::Range(1, 1 << 16));
  app.add_option("--epochs", f.epochs)->check(CLI::Range(1, 1000));
  app.add_option("--batch-size", f.batch_size, "Images per replica per step")->check(CLI::Range(1, 1 << 20));
  app.add_option("--lr", f.lr)->check(CLI::Range(0.0, 100.0));
  app.add_option("--momentum", f.momentum)->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", f.seed);
  app.add_option("--data", f.data, "Fashion-MNIST's folder");
  app.add_option("--train-samples", f.train_samples, "Train on the first N images only (0 = all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-dir", f.checkpoint_dir, "Checkpoint here, and resume from here");
  app.add_option("--checkpoint-every", f.checkpoint_every, "Steps between checkpoints")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--keep-checkpoints", f.keep_checkpoints)->check(CLI::Range(2, 1000));
  app.add_option("--stop-after-steps", f.stop_after_steps,
                 "Checkpoint and exit after this step (tests of resuming)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", f.threads, "LibTorch threads per rank (0 = cores / local ranks)")
      ->check(CLI::Range(0, 1024));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run(f);
  } catch (const std::exception& e) {  // dtrain's errors say who, what and how long
    std::fprintf(stderr, "train_pipeline: %s\n", e.what());
    return 1;
  }
}
