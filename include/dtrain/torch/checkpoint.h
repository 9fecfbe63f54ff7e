// Checkpoints for exact resume: everything a training step depends on, written atomically by one
// rank, loaded by every rank.
//
//   dtrain::CheckpointManager ckpt({.dir = "ckpt", .keep = 3}, pg);
//   dtrain::TrainingProgress at;
//   if (auto loaded = ckpt.load_latest(*model, sgd.get())) at = loaded->progress;  // collective
//   sampler.set_epoch(at.epoch, at.epoch_consumed);
//   ... after a step: at.step = step; at.epoch_consumed = sampler.consumed(trained);
//   ckpt.save(*model, sgd.get(), at);   // rank 0 copies the tensors, a thread writes them
//
// A checkpoint is a directory DIR/step-000120 holding
//   model.safetensors      parameters and buffers under PyTorch's names (loadable by PyTorch)
//   optimizer.safetensors  the optimizer's state per parameter, `optimizer.<param>.<state>`
//                          (SGD momentum_buffer; Adam/AdamW step, exp_avg, exp_avg_sq,
//                          max_exp_avg_sq); its hyper-parameters are in the manifest
//   rng.safetensors        LibTorch's default CPU generator (the writer's; every rank gets it)
//   manifest.json          step, epoch, the epoch's position, the world size, each file's size
//                          and CRC-32, and a CRC-32 of the manifest itself
// Writing is atomic: the files go to DIR/.step-000120.tmp-<pid>, each is fsync'ed, the manifest
// last, then the directory is renamed into place and DIR is fsync'ed; the newest `keep` are kept.
// A process killed mid-save leaves only a temporary directory (removed by the next writer);
// loading takes the newest checkpoint whose manifest and checksums verify, logs why each newer
// one was skipped (which file, expected and found size or CRC), and throws when none verifies.
// The writer keeps its last copy of the tensors and copies into it at the next save: one more
// copy of the model and optimizer state stays allocated on that rank, and a save costs a memcpy,
// on the training thread or (copy_in_background) on the writing thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace dtrain {

class ProcessGroup;

struct CheckpointOptions {
  std::string dir;  // created by the writer when missing
  int keep = 3;     // newest checkpoints kept after each save (at least 1)
  int writer_rank = 0;
  // Write on a background thread; the tensors are still copied on the caller's thread, so
  // training may go on changing them at once. false: save() returns once the files are durable.
  bool async = true;
  // With async: copy the parameters and the optimizer state on the writing thread too, while
  // training goes on (the step's stall is then the buffers and the generator, not the model).
  // The caller must not change them (the optimizer step, loading) before wait_copied() returns;
  // the forward and backward passes only read them. CUDA tensors are still copied by save().
  bool copy_in_background = false;
  // How long a save, wait() or the destructor waits for the write in flight before failing.
  std::chrono::milliseconds write_timeout{std::chrono::minutes(10)};
  // For tests: called on the writing thread after each file is written and flushed, before the
  // manifest that makes the checkpoint valid (e.g. to be killed in the middle of a save).
  std::function<void(const std::string& path)> after_file;
};

// Where training stands, besides the tensors.
struct TrainingProgress {
  int64_t step = 0;            // optimizer steps taken
  int64_t epoch = 0;           // the epoch in progress
  int64_t epoch_consumed = 0;  // its samples trained by all ranks together (sampler.consumed())
  int64_t epoch_size = 0;      // samples in an epoch (informative)
  int world_size = 0;          // set by save(): the world size the checkpoint was taken at
  std::map<std::string, double> values;  // any other numbers to restore (e.g. a loss average)
};

struct LoadedCheckpoint {
  std::string path;  // DIR/step-000120
  TrainingProgress progress;
  // Newer checkpoints that did not verify, each with why (on the writer rank; logged there).
  std::vector<std::string> skipped;
};

// What saving costs. The snapshot (copying the tensors) and any wait for the previous write stall
// training; with async the write itself does not.
struct CheckpointStats {
  int saves = 0;           // completed writes
  double snapshot_ms = 0;  // last save: copying the tensors, on the training thread
  double blocked_ms = 0;   // last save: waiting for the previous write, on the training thread
  double copy_ms = 0;      // last completed write: copying in the background (copy_in_background)
  double write_ms = 0;     // last completed write: files, fsync, rename, pruning
  // Every wait of the training thread for the writing thread: in save(), wait(), wait_copied().
  double total_blocked_ms = 0;
  double total_snapshot_ms = 0, total_copy_ms = 0, total_write_ms = 0;
  uint64_t bytes = 0;  // of the last completed checkpoint
};

class CheckpointManager {
 public:
  // group: the job's ranks (null for one process). Only `writer_rank` writes.
  explicit CheckpointManager(CheckpointOptions options,
                             std::shared_ptr<ProcessGroup> group = nullptr);
  // Waits (up to write_timeout) for the write in flight; logs its error, if any.
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Collective when there is a group. The writer picks the newest checkpoint that verifies and
  // every rank loads that one into `module`, `optimizer` (may be null) and LibTorch's CPU
  // generator. nullopt when DIR holds no checkpoint. Throws InvalidArgumentError, on every rank,
  // when none verifies, when the model or optimizer does not fit, or when a rank cannot read it.
  std::optional<LoadedCheckpoint> load_latest(torch::nn::Module& module,
                                              torch::optim::Optimizer* optimizer);

  // Not collective: on the writer rank, waits for the previous write, copies every tensor, and
  // writes them (in the background when async) as DIR/step-<progress.step>; other ranks return
  // at once. Throws the previous write's error, if it failed. SGD, Adam and AdamW are supported;
  // another optimizer, or a parameter the module does not name, is an InvalidArgumentError.
  void save(const torch::nn::Module& module, const torch::optim::Optimizer* optimizer,
            TrainingProgress progress);

  // Not collective (any rank that sees DIR): the newest checkpoint of DIR that verifies, each
  // newer one that does not skipped with its reason (logged), as load_latest does on the writer.
  // `newest` is nullopt when none verifies; `count` says how many DIR holds.
  struct Found {
    std::optional<LoadedCheckpoint> newest;  // path, progress and the skipped ones
    std::vector<std::string> skipped;
    size_t count = 0;
  };
  Found find_latest();
  // Not collective: loads the checkpoint at `path` (verified again unless find_latest() just
  // verified it) into `module`, `optimizer` (may be null) and LibTorch's CPU generator.
  // Throws InvalidArgumentError when it is damaged or does not fit the model or optimizer.
  LoadedCheckpoint load(const std::string& path, torch::nn::Module& module,
                        torch::optim::Optimizer* optimizer);

  // Waits for the write in flight (up to write_timeout) and rethrows its error.
  void wait();
  // Waits (up to write_timeout) until the last save's tensors are copied: at once unless
  // copy_in_background. Call it before the optimizer step changes them.
  void wait_copied();
  CheckpointStats stats() const;
  const std::string& dir() const;
  bool is_writer() const;

 private:
  struct Shared;
  CheckpointOptions options_;
  std::shared_ptr<ProcessGroup> group_;
  int rank_ = 0;
  std::shared_ptr<Shared> shared_;  // with the writing thread, which may outlive us on a hang
  // The manifest find_latest() verified last, and its checkpoint: load() skips verifying again.
  std::string verified_path_, verified_manifest_;
};

// "DIR/step-000120": the directory of the checkpoint of `step`.
std::string checkpoint_path(const std::string& dir, int64_t step);

}  // namespace dtrain
