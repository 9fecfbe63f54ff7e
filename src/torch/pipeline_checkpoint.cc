#include "dtrain/torch/pipeline_checkpoint.h"

#include <array>
#include <filesystem>

#include <fmt/format.h>

#include "common/log.h"
#include "dtrain/error.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

// The pipeline sizes other than `p` whose directories DIR holds.
std::vector<int> other_layouts(const std::string& root, int p) {
  std::vector<int> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    int r = 0, q = 0;
    const std::string name = e.path().filename().string();
    if (std::sscanf(name.c_str(), "pipeline-%d-of-%d", &r, &q) == 2 && q != p &&
        std::find(out.begin(), out.end(), q) == out.end())
      out.push_back(q);
  }
  return out;
}

}  // namespace

PipelineCheckpoint::PipelineCheckpoint(CheckpointOptions options, const ParallelLayout& layout)
    : pipeline_group_(layout.pipeline_group()),
      data_group_(layout.data_group()),
      world_(layout.world()),
      root_(options.dir),
      pipeline_rank_(layout.stage()),
      pipeline_ranks_(layout.stages()) {
  if (root_.empty()) throw InvalidArgumentError("PipelineCheckpoint: the directory is empty");
  options.dir = fmt::format("{}/pipeline-{}-of-{}", root_, pipeline_rank_, pipeline_ranks_);
  options.writer_rank = 0;  // the first replica of this pipeline rank
  manager_ = std::make_unique<CheckpointManager>(std::move(options), layout.data_group());
}

PipelineCheckpoint::~PipelineCheckpoint() = default;

const std::string& PipelineCheckpoint::dir() const { return manager_->dir(); }

std::optional<LoadedCheckpoint> PipelineCheckpoint::load_latest(
    torch::nn::Module& module, torch::optim::Optimizer* optimizer) {
  ProcessGroup& g = *pipeline_group_;
  if (auto others = other_layouts(root_, pipeline_ranks_); !others.empty())
    throw InvalidArgumentError(fmt::format(
        "rank {} of the pipeline: {} holds checkpoints of a pipeline of {} ranks; this job has {}: "
        "resume with that many stages, or give another --checkpoint-dir",
        pipeline_rank_, root_, fmt::join(others, ", "), pipeline_ranks_));
  // The newest step each pipeline rank can load, as its writer sees it (its replicas may not
  // see the same files: they load what the writer chose, or fail saying so); every rank
  // resumes from the least of them.
  std::array<int64_t, 1> chosen{-1};
  if (manager_->is_writer()) {
    CheckpointManager::Found found = manager_->find_latest();
    if (found.newest) chosen[0] = found.newest->progress.step;
  }
  if (data_group_ && data_group_->size() > 1)
    data_group_->broadcast(TensorView::of(std::span<int64_t>(chosen)), {.root = 0})->wait();
  const int64_t newest = chosen[0];
  std::array<int64_t, 2> lo{newest, -newest};  // min and -max in one all-reduce
  g.allreduce(TensorView::of(std::span<int64_t>(lo)), {.op = ReduceOp::kMin})->wait();
  const int64_t least = lo[0], most = -lo[1];
  if (least < 0 && most < 0) return std::nullopt;
  if (least < 0)
    throw InvalidArgumentError(fmt::format(
        "rank {} of the pipeline: some pipeline ranks have checkpoints in {} (the newest of step "
        "{}) and others none (this one's newest: {}); the stages cannot resume from different "
        "steps: restore the missing pipeline-*-of-{} directories or start in an empty directory",
        pipeline_rank_, root_, most, newest < 0 ? std::string("none") : std::to_string(newest),
        pipeline_ranks_));
  if (least < newest)
    DTRAIN_LOG_WARN(
        "rank {} of the pipeline: resuming from step {}, the newest every stage "
        "saved; this stage's step {} is newer (a save cut short elsewhere)",
        pipeline_rank_, least, newest);
  std::optional<LoadedCheckpoint> loaded;
  std::string error;
  try {
    loaded =
        manager_->load(fmt::format("{}/step-{:06d}", manager_->dir(), least), module, optimizer);
  } catch (const Error& e) {
    error = e.what();
  }
  // Over the whole job: a replica that could not load must not leave the others training.
  std::array<int64_t, 1> failed{error.empty() ? -1 : pipeline_rank_};
  world_->allreduce(TensorView::of(std::span<int64_t>(failed)), {.op = ReduceOp::kMax})->wait();
  if (!error.empty())
    throw InvalidArgumentError(
        fmt::format("rank {} of the pipeline cannot load step {}, the newest every stage saved: {}",
                    pipeline_rank_, least, error));
  if (failed[0] >= 0)
    throw InvalidArgumentError(fmt::format(
        "rank {} of the pipeline cannot load step {}, the newest every stage saved (its own "
        "error says why); this rank's stage is not loaded either",
        failed[0], least));
  return loaded;
}

void PipelineCheckpoint::save(const torch::nn::Module& module,
                              const torch::optim::Optimizer* optimizer, TrainingProgress progress) {
  manager_->save(module, optimizer, std::move(progress));
}

void PipelineCheckpoint::wait() { manager_->wait(); }

}  // namespace dtrain
