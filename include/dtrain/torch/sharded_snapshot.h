// A sharded run's training state kept in memory, each rank's shard twice: by the rank and by a
// neighbour on another node (the next rank when the job has one), so that when a rank dies, or a
// whole node, the survivors still hold every shard of the newest snapshot and reshard it over
// their new world, with no file system and no disk: live recovery for ZeRO (dtrain/live_world.h).
//
//   dtrain::ShardedSnapshot snap;                      // lives across worlds
//   ... after each step:  at.step = step; snap.take(sdp, &opt, at);         // collective
//   ... a rank died, the survivors re-formed: a ShardedDataParallel on the new world, then
//   if (auto from = snap.restore(sdp, &opt)) at = *from;                     // collective
//
// take() copies this rank's shards of the parameters and of the optimizer's state (with rank
// 0's buffers and LibTorch's generator) into memory it keeps, sends the copy to its neighbour
// and keeps the neighbour's, in pieces as sharded checkpoints hold them (sharded_checkpoint.h),
// so a snapshot taken at one world size is restored at any other, into any stage. A snapshot
// counts once every rank is known to have both copies (at the next take()); until then the
// previous one is kept, so a death during take() loses at most the snapshot in progress. Memory:
// four copies of this rank's shard (two snapshots, each with a neighbour's).
//
// With copy_in_background, take() leaves the copy of this rank's shards to a thread, which
// runs while the next step's forward and backward passes only read them; the training loop
// calls wait_copied() before its optimizer step changes them (a large model's copy then stalls
// no step).
//
// restore() is collective over the new world: survivors, and newcomers that hold nothing. It
// takes the newest snapshot whose every shard some member holds, each old shard sent by the
// member holding it to the members whose new range needs it: a newcomer receives its state in
// pieces from several members. A rank and the neighbour holding its copy dying together lose
// that snapshot (restore() says which shards no member holds); keep sharded checkpoints on disk
// too for that case.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "dtrain/torch/checkpoint.h"

namespace torch::optim {
class Optimizer;
}

namespace dtrain {

class ShardedDataParallel;

struct ShardedSnapshotOptions {
  // This rank's node: a neighbour is chosen on another node when there is one. -1 = the node
  // the launcher says (NODE_RANK or GROUP_RANK; 0 without a launcher).
  int node = -1;
  std::chrono::milliseconds timeout{0};  // of each collective and transfer; 0 = the group's
  // This rank's shards copied by a thread while training goes on; call wait_copied() before
  // the optimizer step.
  bool copy_in_background = false;
};

struct ShardedSnapshotStats {
  int64_t takes = 0;
  // The training thread's time in the last take() and wait_copied(), but for peers_ms.
  double stall_ms = 0;
  double total_stall_ms = 0;  // over every take()
  // Of the last take(), waiting for the other ranks to come to it (the small all-gather that
  // keeps snapshots consistent): the time the slowest rank's step took longer, which the next
  // collective would wait without a snapshot.
  double peers_ms = 0;
  double total_peers_ms = 0;
  double copy_ms = 0;  // the last copy of this rank's shards (on whichever thread)
};

class ShardedSnapshot {
 public:
  explicit ShardedSnapshot(ShardedSnapshotOptions options = {});
  ~ShardedSnapshot();
  ShardedSnapshot(const ShardedSnapshot&) = delete;
  ShardedSnapshot& operator=(const ShardedSnapshot&) = delete;

  // Collective over sdp's group: snapshots this rank's shards and `optimizer`'s state of them
  // (null: parameters only) at `progress`. The copies travel to and from the neighbours while
  // training goes on; the next take() (or restore()) waits for them. An error of the group (a
  // peer died) is rethrown as it came, the previous snapshot kept.
  void take(ShardedDataParallel& sdp, const torch::optim::Optimizer* optimizer,
            TrainingProgress progress);

  // Waits until the last take()'s copy of this rank's shards is made (at once unless
  // copy_in_background) and sends it to the neighbour: call it before the optimizer step
  // changes the shards. take() and restore() call it too. An error of the group (a peer died)
  // is rethrown as it came.
  void wait_copied();

  // Collective over sdp's group: the newest snapshot some member holds whole, loaded into this
  // rank's shards, `optimizer` (may be null), the buffers and LibTorch's generator; its progress
  // (world_size: the world it was taken at). nullopt when no member holds a snapshot (none was
  // taken yet). DataLossError on every member, saying which shards are missing, when snapshots
  // are held but none whole.
  std::optional<TrainingProgress> restore(ShardedDataParallel& sdp,
                                          torch::optim::Optimizer* optimizer);

  // Bytes this rank holds: its own copies and its neighbours'.
  int64_t bytes_held() const;

  ShardedSnapshotStats stats() const { return stats_; }

 private:
  struct Held;
  struct Exchange;
  // Waits for the copies take() sent and received; on a failure (a peer died) keeps what came
  // whole and rethrows, or not.
  void settle(bool rethrow);
  // Sends this rank's copy to its neighbour once it is made; with `wait`, waits for a copy in
  // the background, else leaves it to a later call.
  void finish_copy(bool wait);

  ShardedSnapshotOptions options_;
  int node_ = 0;
  int64_t sequence_ = 0;  // of the newest snapshot this rank took part in
  // Two snapshots: `current_` counts (every rank holds both copies of it, or restore() chose
  // it); the other is free for the next take(), or holds the newest, which counts once every rank
  // is known to have its copies (`whole_`: this rank has).
  std::unique_ptr<Held> slots_[2];
  int current_ = -1;
  int whole_ = -1;
  std::unique_ptr<Exchange> in_flight_;
  ShardedSnapshotStats stats_;
};

}  // namespace dtrain
