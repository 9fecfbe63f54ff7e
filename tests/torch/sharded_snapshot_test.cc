// Sharded snapshots in memory over real processes: a rank that dies (its process gone) and the
// survivors, resharded over their new world from the copies their neighbours held, train on
// exactly as from a sharded checkpoint of the same step; a newcomer holding nothing receives its
// shards from several members; a node's ranks dying together lose nothing when the copies went
// to another node, and lose the snapshot, said so, when they did not; a death before a snapshot
// finished leaves the previous one.
#include "dtrain/torch/sharded_snapshot.h"

#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "dtrain/error.h"
#include "dtrain/torch/safetensors.h"
#include "dtrain/torch/sharded_checkpoint.h"
#include "dtrain/torch/sharded_data_parallel.h"
#include "support/expect.h"
#include "support/multiproc.h"
#include "torch/sharded_test_support.h"
#include "torch/torch_test_support.h"

namespace dtrain {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using testing::expect_all_ok;
using testing::fresh_dir;
using testing::make_group;
using testing::max_difference;
using testing::run_ranks;

// With a batch norm: its running statistics are buffers, restored with the rest.
torch::nn::Sequential make_seq(int seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16),
                               torch::nn::ReLU(), torch::nn::Linear(16, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 4));
}

// The reference: the sharded checkpoint of step 3 loaded at `n` ranks and stage 3, trained to
// step 6; its parameters are written to `out`.
void reference_from_checkpoint(const std::string& dir, int n, const std::string& out) {
  const int port = testing::free_port();
  expect_all_ok(run_ranks(
      n,
      [&](int rank) {
        at::set_num_threads(1);
        auto pg = make_group(rank, n, port);
        ShardedDataParallel sdp(make_seq(7), pg, {.stage = 3});
        torch::optim::Adam opt(sdp.parameters(), 0.01);
        ShardedCheckpoint ckpt({.dir = dir}, pg);
        auto loaded = ckpt.load_latest(sdp, &opt);
        RANK_CHECK(loaded && loaded->progress.step == 3, "the checkpoint of step 3 did not load");
        testing::train_sharded_steps(sdp, opt, rank, n, 3, 6);
        auto full = sdp.full_parameters();
        if (rank == 0) save_safetensors(out, full);
      },
      60s));
}

// 4 ranks train 3 steps, snapshot (in memory) and checkpoint (files) at step 3, and train a
// step more; then `dead` ranks die. The others (and, with `newcomers`, fresh processes in the
// dead ranks' places, holding nothing) form a new world, restore the snapshot and train to step
// 6; rank 0 writes the parameters to `out`. `nodes`: each rank's node. With `background`, the
// snapshot is copied while step 4's forward and backward passes run.
void lose_and_restore(const std::string& dir, const std::vector<int>& nodes,
                      const std::vector<int>& dead, bool newcomers, const std::string& out,
                      bool background = false) {
  const int port = testing::free_port(), port2 = testing::free_port();
  const int n = 4, survivors = n - static_cast<int>(dead.size());
  const int m = newcomers ? n : survivors;
  expect_all_ok(run_ranks(
      n,
      [&](int rank) {
        at::set_num_threads(1);
        auto pg = make_group(rank, n, port);
        auto sdp =
            std::make_unique<ShardedDataParallel>(make_seq(1), pg, ShardingOptions{.stage = 3});
        auto opt = std::make_unique<torch::optim::Adam>(sdp->parameters(), 0.01);
        auto snap = std::make_unique<ShardedSnapshot>(
            ShardedSnapshotOptions{.node = nodes[rank], .copy_in_background = background});
        ShardedCheckpoint ckpt({.dir = dir}, pg);
        testing::train_sharded_steps(*sdp, *opt, rank, n, 0, 3);
        TrainingProgress at;
        at.step = 3;
        at.values["loss"] = 0.25;
        snap->take(*sdp, opt.get(), at);
        ckpt.save(*sdp, opt.get(), at);
        RANK_CHECK(snap->bytes_held() > 0, "holds nothing after take()");
        // The state moves on (restore() goes back to step 3) once the copy is made.
        testing::train_sharded_steps(*sdp, *opt, rank, n, 3, 4, [&] { snap->wait_copied(); });
        RANK_CHECK(snap->stats().takes == 1 && snap->stats().copy_ms > 0,
                   "stats: {} take(s), copy {} ms", snap->stats().takes, snap->stats().copy_ms);
        const bool died = std::find(dead.begin(), dead.end(), rank) != dead.end();
        if (died && !newcomers) ::_exit(0);  // its process and everything it held, gone
        if (died)
          snap = std::make_unique<ShardedSnapshot>(ShardedSnapshotOptions{.node = nodes[rank]});
        int new_rank = rank;
        if (!newcomers)
          for (int d : dead) new_rank -= d < rank ? 1 : 0;
        auto pg2 = make_group(new_rank, m, port2);
        auto sdp2 =
            std::make_unique<ShardedDataParallel>(make_seq(2), pg2, ShardingOptions{.stage = 3});
        torch::optim::Adam opt2(sdp2->parameters(), 0.01);
        auto from = snap->restore(*sdp2, &opt2);
        RANK_CHECK(from.has_value(), "nothing restored");
        RANK_CHECK(from->step == 3 && from->world_size == 4 && from->values.at("loss") == 0.25,
                   "restored step {} of {} rank(s)", from->step, from->world_size);
        testing::train_sharded_steps(*sdp2, opt2, new_rank, m, 3, 6);
        auto full = sdp2->full_parameters();
        if (new_rank == 0) save_safetensors(out, full);
      },
      90s));
}

TEST(ShardedSnapshot, SurvivorsOfADeadRankGoOnFromItsNeighboursCopyAsFromACheckpoint) {
  const std::string dir = fresh_dir("sharded_snapshot_dead");
  const std::string restored = dir + "-restored.safetensors", loaded = dir + "-loaded.safetensors";
  lose_and_restore(dir, {0, 0, 0, 0}, {2}, /*newcomers=*/false, restored);
  reference_from_checkpoint(dir, 3, loaded);
  const double diff = max_difference(load_safetensors(restored), load_safetensors(loaded));
  EXPECT_EQ(diff, 0) << "restored from memory at 3 ranks: " << diff
                     << " from the checkpoint of the same step";
}

TEST(ShardedSnapshot, ACopyMadeInTheBackgroundHoldsItsStepNotTheNext) {
  const std::string dir = fresh_dir("sharded_snapshot_background");
  const std::string restored = dir + "-restored.safetensors", loaded = dir + "-loaded.safetensors";
  lose_and_restore(dir, {0, 0, 0, 0}, {2}, /*newcomers=*/false, restored, /*background=*/true);
  reference_from_checkpoint(dir, 3, loaded);
  EXPECT_EQ(max_difference(load_safetensors(restored), load_safetensors(loaded)), 0);
}

TEST(ShardedSnapshot, ANewcomerHoldingNothingReceivesItsShardsFromTheMembers) {
  const std::string dir = fresh_dir("sharded_snapshot_newcomer");
  const std::string restored = dir + "-restored.safetensors", loaded = dir + "-loaded.safetensors";
  lose_and_restore(dir, {0, 0, 0, 0}, {1}, /*newcomers=*/true, restored);
  reference_from_checkpoint(dir, 4, loaded);
  EXPECT_EQ(max_difference(load_safetensors(restored), load_safetensors(loaded)), 0);
}

TEST(ShardedSnapshot, ANodeLostWholeLosesNothingWhenTheCopiesWentToAnotherNode) {
  const std::string dir = fresh_dir("sharded_snapshot_node");
  const std::string restored = dir + "-restored.safetensors", loaded = dir + "-loaded.safetensors";
  lose_and_restore(dir, {0, 0, 1, 1}, {2, 3}, /*newcomers=*/false, restored);
  reference_from_checkpoint(dir, 2, loaded);
  EXPECT_EQ(max_difference(load_safetensors(restored), load_safetensors(loaded)), 0);
}

// On one node each rank's copy is with the next rank: ranks 2 and 3 dying together take rank
// 2's shard with them (its copy was on rank 3).
TEST(ShardedSnapshot, NeighboursDyingTogetherLoseTheSnapshotAndSaySo) {
  const int port = testing::free_port(), port2 = testing::free_port();
  expect_all_ok(run_ranks(
      4,
      [&](int rank) {
        at::set_num_threads(1);
        auto pg = make_group(rank, 4, port);
        ShardedDataParallel sdp(make_seq(1), pg, {.stage = 3});
        torch::optim::Adam opt(sdp.parameters(), 0.01);
        ShardedSnapshot snap({.node = 0});
        testing::train_sharded_steps(sdp, opt, rank, 4, 0, 2);
        snap.take(sdp, &opt, {.step = 2});
        if (rank >= 2) ::_exit(0);
        auto pg2 = make_group(rank, 2, port2);
        ShardedDataParallel sdp2(make_seq(2), pg2, {.stage = 3});
        torch::optim::Adam opt2(sdp2.parameters(), 0.01);
        std::string why;
        try {
          auto from = snap.restore(sdp2, &opt2);
          RANK_CHECK(false, "restored step {} without rank 2's shard", from ? from->step : -1);
        } catch (const DataLossError& e) {
          why = e.what();
        }
        RANK_CHECK(why.find("lacks the shard(s) of rank(s) 2 of that world") != std::string::npos &&
                       why.find("step 2, taken at 4 ranks") != std::string::npos,
                   "the reason: {}", why);
        // A world that never took one holds none: nothing to restore, nothing lost.
        ShardedSnapshot fresh({.node = 0});
        RANK_CHECK(!fresh.restore(sdp2, &opt2), "a fresh snapshot restored something");
      },
      60s));
}

// Rank 1 dies after the snapshot of step 2 and before the next: the others' take() of step 3
// fails with the group's error, and they go on from step 2's.
TEST(ShardedSnapshot, ADeathDuringATakeLeavesThePreviousSnapshot) {
  const int port = testing::free_port(), port2 = testing::free_port();
  expect_all_ok(run_ranks(
      3,
      [&](int rank) {
        at::set_num_threads(1);
        auto pg = make_group(rank, 3, port, {}, 5s);
        ShardedDataParallel sdp(make_seq(1), pg, {.stage = 2});
        torch::optim::Adam opt(sdp.parameters(), 0.01);
        ShardedSnapshot snap({.node = 0, .timeout = 5s});
        testing::train_sharded_steps(sdp, opt, rank, 3, 0, 2);
        snap.take(sdp, &opt, {.step = 2});
        testing::train_sharded_steps(sdp, opt, rank, 3, 2, 3);
        if (rank == 1) ::_exit(0);
        bool failed = false;
        try {
          snap.take(sdp, &opt, {.step = 3});
        } catch (const std::exception& e) {
          failed = true;
        }
        RANK_CHECK(failed, "take() went through without rank 1");
        auto pg2 = make_group(rank == 0 ? 0 : 1, 2, port2);
        ShardedDataParallel sdp2(make_seq(2), pg2, {.stage = 1});
        torch::optim::Adam opt2(sdp2.parameters(), 0.01);
        auto from = snap.restore(sdp2, &opt2);
        RANK_CHECK(from && from->step == 2, "restored {}", from ? from->step : -1);
      },
      60s));
}

}  // namespace
}  // namespace dtrain
