// Checkpoints of a sharded run (ShardedDataParallel): every rank writes its own shard, all at
// once, and one manifest says which elements of which parameter each file holds. The format does
// not depend on the world size or the layout: a checkpoint saved at 2 ranks loads at 3, into any
// stage, into a whole model (DDP or one process), and exports one safetensors file of the model.
//
//   dtrain::ShardedCheckpoint ckpt({.dir = "ckpt", .keep = 3}, pg);
//   dtrain::TrainingProgress at;
//   if (auto loaded = ckpt.load_latest(sdp, &opt)) at = loaded->progress;   // collective
//   ... after a step: at.step = step; ckpt.save(sdp, &opt, at);              // collective
//
//   dtrain::load_sharded_checkpoint("ckpt/step-000120", *model, &opt);  // a whole model
//   dtrain::export_sharded_checkpoint("ckpt/step-000120", "model.safetensors");
//
// DIR/step-000120 holds
//   shard-00000-of-00002.safetensors  rank 0's elements: `<param>` and `optimizer.<param>.<state>`
//                                     (exp_avg, exp_avg_sq, momentum_buffer...), 1-D slices of
//                                     the flattened tensors; rank 0's file also holds the buffers
//   rng.safetensors                   LibTorch's CPU generator (rank 0's; every rank gets it)
//   manifest.json                     step and progress, the world size; each parameter's shape
//                                     and pieces (file, first element, count); the buffers; the
//                                     optimizer's type, hyper-parameters and step; every file's
//                                     size and CRC-32; the manifest's own CRC-32
// Saving is atomic, as for whole-model checkpoints (checkpoint.h): the ranks write into
// DIR/.step-000120.tmp-<pid of rank 0>, each fsyncs its file and reports its size and CRC-32,
// then rank 0 writes the manifest, renames the directory into place and keeps the newest `keep`.
// DIR must be one directory that every rank sees (a shared filesystem across hosts). Loading
// takes the newest checkpoint whose manifest and files verify (rank 0 checks, every rank loads
// the same one), as whole-model checkpoints do. SGD (with momentum), Adam and AdamW, with one
// param group, are supported.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "dtrain/process_group.h"
#include "dtrain/torch/checkpoint.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace dtrain {

class ShardedDataParallel;

struct ShardedCheckpointOptions {
  std::string dir;                       // created by rank 0 when missing
  int keep = 3;                          // newest checkpoints kept after each save (at least 1)
  std::chrono::milliseconds timeout{0};  // of the collectives that agree on a save or load
};

class ShardedCheckpoint {
 public:
  // group: the ranks of the ShardedDataParallel it saves (its group()).
  ShardedCheckpoint(ShardedCheckpointOptions options, std::shared_ptr<ProcessGroup> group);

  // Collective: every rank writes its shards of the parameters and of `optimizer`'s state (null:
  // parameters only) as DIR/step-<progress.step>. Returns when the checkpoint is durable. A rank
  // that cannot write makes every rank throw, naming it; nothing is left in DIR but what was.
  void save(ShardedDataParallel& sdp, const torch::optim::Optimizer* optimizer,
            TrainingProgress progress);
  // Collective: the newest checkpoint of DIR that verifies, loaded into this rank's shards, the
  // optimizer (may be null), the buffers and LibTorch's generator, whatever world size and stage
  // it was saved at. nullopt when DIR holds none; InvalidArgumentError on every rank when none
  // verifies or it does not fit the model or the optimizer.
  std::optional<LoadedCheckpoint> load_latest(ShardedDataParallel& sdp,
                                              torch::optim::Optimizer* optimizer);
  const std::string& dir() const { return options_.dir; }

 private:
  ShardedCheckpointOptions options_;
  std::shared_ptr<ProcessGroup> group_;
};

// Not collective: a sharded checkpoint (DIR/step-N) into a whole model and its optimizer (may
// be null), e.g. on each rank of a DDP run or in one process. Verifies its files first; throws
// InvalidArgumentError when it is damaged or does not fit.
LoadedCheckpoint load_sharded_checkpoint(const std::string& path, torch::nn::Module& module,
                                         torch::optim::Optimizer* optimizer);
// Not collective: the model of a sharded checkpoint as one safetensors file (parameters and
// buffers under their PyTorch names, loadable by load_module_state or PyTorch).
void export_sharded_checkpoint(const std::string& path, const std::string& safetensors_file);
// The newest checkpoint of DIR that verifies ("DIR/step-000120"), or nullopt.
std::optional<std::string> latest_sharded_checkpoint(const std::string& dir);

}  // namespace dtrain
