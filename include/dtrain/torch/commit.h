// In-memory commits, and resuming from the newest state any rank holds.
//
// Elastic `dtrain run` gives its workers a directory in memory (DTRAIN_COMMIT_DIR, on /dev/shm),
// created and removed by the agent, which outlives its workers' restarts. The lowest local rank
// of each node commits there every step or few (a CheckpointManager: same format, keep 2, a
// memcpy on the training thread and a tmpfs write in the background); disk checkpoints stay for
// losing whole machines.
//
//   dtrain::CheckpointManager disk({.dir = "ckpt"}, pg);
//   std::unique_ptr<dtrain::CheckpointManager> commits;
//   if (auto o = dtrain::commit_options_from_env(pg.get()))
//     commits = std::make_unique<dtrain::CheckpointManager>(*o, pg);
//   auto resumed = dtrain::resume_newest({{&disk, "checkpoint"}, {commits.get(), "in-memory
//   commit"}},
//                                        *model, sgd.get(), pg.get());        // collective
//   ... after each step: commits->save(*model, sgd.get(), progress);
//
// resume_newest: each source is read by its writer rank (rank 0 for the disk, the node's lowest
// rank for its commits), which verifies it newest first and skips damaged ones with the reason;
// the ranks agree on the newest step anyone holds (all-reduce MAX), the lowest rank holding it
// loads it, and model, buffers, optimizer state, generator and progress are broadcast to all.
// So no filesystem needs to be shared for resuming, and a node that lost its commits (a new
// machine) gets the state of one that kept them.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/torch/checkpoint.h"

namespace dtrain {

class ProcessGroup;

// DTRAIN_COMMIT_DIR as a CheckpointManager's options: keep 2, written by this node's lowest rank
// (RANK - LOCAL_RANK). nullopt when the variable is unset.
std::optional<CheckpointOptions> commit_options_from_env(const ProcessGroup* group);

struct ResumeSource {
  CheckpointManager* manager = nullptr;  // null: skipped
  std::string kind;                      // for messages: "checkpoint", "in-memory commit"
};

struct Resumed {
  LoadedCheckpoint checkpoint;  // path (on the loading rank's machine) and progress
  std::string kind;             // of the source it came from
  int root = 0;                 // the rank that loaded it and broadcast it
};

// Collective (every rank, the same sources in the same order). nullopt when no rank holds any
// state: a fresh start. Throws InvalidArgumentError on every rank when sources hold checkpoints
// but none verifies anywhere (rather than silently starting over), or when the chosen one cannot
// be loaded (it does not fit the model or optimizer). `timeout` bounds each collective (0: the
// group's default).
std::optional<Resumed> resume_newest(
    const std::vector<ResumeSource>& sources, torch::nn::Module& module,
    torch::optim::Optimizer* optimizer, ProcessGroup* group,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

}  // namespace dtrain
