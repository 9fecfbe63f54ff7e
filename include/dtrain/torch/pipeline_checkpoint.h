// Checkpoints of a pipeline-parallel job: each pipeline rank's stages (parameters, optimizer
// state) in DIR/pipeline-<r>-of-<p>, written by the rank's first replica with CheckpointManager
// (atomic, checksummed, the newest `keep` kept); loading agrees on the newest step that every
// pipeline rank saved, so a job killed in the middle of a save resumes from the step before on
// every stage instead of mixing two.
//
//   dtrain::PipelineCheckpoint ckpt({.dir = "ckpt", .keep = 3}, layout);
//   if (auto loaded = ckpt.load_latest(*stage, &opt)) at = loaded->progress;   // collective
//   ...
//   ckpt.save(*stage, &opt, at);            // every rank calls it; one per stage writes
//
// Save at the same steps on every rank (keep at least 2, so a save cut short leaves a common
// step). A directory written with another number of pipeline ranks is refused: the stages
// would not fit.
#pragma once

#include <memory>
#include <optional>

#include "dtrain/parallel_layout.h"
#include "dtrain/torch/checkpoint.h"

namespace dtrain {

class PipelineCheckpoint {
 public:
  // `options.dir` is the job's directory; `options.writer_rank` is ignored (the first replica
  // of each pipeline rank writes).
  PipelineCheckpoint(CheckpointOptions options, const ParallelLayout& layout);
  ~PipelineCheckpoint();
  PipelineCheckpoint(const PipelineCheckpoint&) = delete;
  PipelineCheckpoint& operator=(const PipelineCheckpoint&) = delete;

  // Collective over the job. nullopt when no pipeline rank has a checkpoint (a fresh start).
  // Throws InvalidArgumentError, on every rank, when DIR was written by another layout, when
  // some ranks have checkpoints and others none, or when a rank cannot load the agreed step.
  std::optional<LoadedCheckpoint> load_latest(torch::nn::Module& module,
                                              torch::optim::Optimizer* optimizer);
  // Not collective: the writer of this pipeline rank saves, others return at once.
  void save(const torch::nn::Module& module, const torch::optim::Optimizer* optimizer,
            TrainingProgress progress);
  void wait();
  // DIR/pipeline-<r>-of-<p>
  const std::string& dir() const;

 private:
  std::unique_ptr<CheckpointManager> manager_;
  std::shared_ptr<ProcessGroup> pipeline_group_, data_group_, world_;
  std::string root_;
  int pipeline_rank_, pipeline_ranks_;
};

}  // namespace dtrain
