// Sharded checkpoints over real processes: exact resume at the same world size, loading at
// another world size and stage, into a whole model in one process, the consolidated export, a
// damaged newest checkpoint, a model that does not fit, a rank that cannot write.
#include "dtrain/torch/sharded_checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "dtrain/error.h"
#include "dtrain/torch/safetensors.h"
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
using testing::max_difference;
using testing::make_group;
using testing::run_ranks;

torch::nn::Sequential make_seq(int seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 4));
}

at::Tensor loss_of(const at::Tensor& out, const at::Tensor& y) {
  return torch::nn::functional::cross_entropy(out, y);
}

TEST(ShardedCheckpoint, ResumesExactlyAndReshardsAcrossWorldSizesAndLayouts) {
  const std::string dir = fresh_dir("sharded_ckpt");
  const std::string reference = dir + "-reference.safetensors";

  // 2 ranks, stage 3: 3 steps, a checkpoint, 2 more steps: the reference.
  int port = testing::free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, 2, port);
    ShardedDataParallel sdp(make_seq(1), pg, {.stage = 3});
    torch::optim::Adam opt(sdp.parameters(), 0.01);
    ShardedCheckpoint ckpt({.dir = dir}, pg);
    RANK_CHECK(!ckpt.load_latest(sdp, &opt), "an empty directory held a checkpoint");
    testing::train_sharded_steps(sdp, opt, rank, 2, 0, 3);
    TrainingProgress at;
    at.step = 3;
    at.values["loss"] = 0.5;
    ckpt.save(sdp, &opt, at);
    testing::train_sharded_steps(sdp, opt, rank, 2, 3, 5);
    auto full = sdp.full_parameters();
    if (rank == 0) save_safetensors(reference, full);
  }, 60s));
  ASSERT_TRUE(fs::exists(dir + "/step-000003/manifest.json"));
  ASSERT_TRUE(fs::exists(dir + "/step-000003/shard-00001-of-00002.safetensors"));

  // The same world size and stage, from other initial weights: bit-equal to the reference.
  port = testing::free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, 2, port);
    ShardedDataParallel sdp(make_seq(2), pg, {.stage = 3});
    torch::optim::Adam opt(sdp.parameters(), 0.01);
    ShardedCheckpoint ckpt({.dir = dir}, pg);
    auto loaded = ckpt.load_latest(sdp, &opt);
    RANK_CHECK(loaded && loaded->progress.step == 3 && loaded->progress.world_size == 2 &&
                   loaded->progress.values.at("loss") == 0.5,
               "loaded {}", loaded ? loaded->path : "nothing");
    testing::train_sharded_steps(sdp, opt, rank, 2, 3, 5);
    double diff = max_difference(sdp.full_parameters(), load_safetensors(reference));
    RANK_CHECK(diff == 0, "resumed at 2 ranks: {} from the run that was not interrupted", diff);
  }, 60s));

  // 3 ranks, stage 2 (other shards, other padding): equal to float rounding.
  port = testing::free_port();
  expect_all_ok(run_ranks(3, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, 3, port);
    ShardedDataParallel sdp(make_seq(3), pg, {.stage = 2});
    torch::optim::Adam opt(sdp.parameters(), 0.01);
    ShardedCheckpoint ckpt({.dir = dir}, pg);
    RANK_CHECK(ckpt.load_latest(sdp, &opt).has_value(), "nothing loaded");
    testing::train_sharded_steps(sdp, opt, rank, 3, 3, 5);
    double diff = max_difference(sdp.full_parameters(), load_safetensors(reference));
    RANK_CHECK(diff < 1e-5, "resumed at 3 ranks, stage 2: {} from the reference", diff);
  }, 60s));

  // One process, a whole model and its own Adam; and the consolidated export.
  const std::string exported = dir + "-model.safetensors";
  expect_all_ok(run_ranks(1, [&](int) {
    at::set_num_threads(1);
    auto model = make_seq(4);
    torch::optim::Adam opt(model->parameters(), 0.01);
    auto path = latest_sharded_checkpoint(dir);
    RANK_CHECK(path && *path == dir + "/step-000003", "latest: {}", path ? *path : "none");
    auto loaded = load_sharded_checkpoint(*path, *model, &opt);
    RANK_CHECK(loaded.progress.step == 3, "step {}", loaded.progress.step);
    export_sharded_checkpoint(*path, exported);
    auto file = load_safetensors(exported);
    for (const auto& p : model->named_parameters())
      RANK_CHECK(file.at(p.key()).equal(p.value()), "exported '{}' differs from the loaded one",
                 p.key());
    for (int step = 3; step < 5; ++step) {
      auto b = testing::global_batch(step, 12);
      opt.zero_grad();
      loss_of(model->forward(b.x), b.y).backward();
      opt.step();
    }
    std::map<std::string, at::Tensor> mine;
    for (const auto& p : model->named_parameters()) mine[p.key()] = p.value().detach();
    double diff = max_difference(mine, load_safetensors(reference));
    RANK_CHECK(diff < 1e-5, "one process: {} from the reference", diff);
  }, 60s));
  fs::remove_all(dir);
  fs::remove(reference);
  fs::remove(exported);
}

TEST(ShardedCheckpoint, ADamagedNewestCheckpointFallsBackToTheOneBefore) {
  const std::string dir = fresh_dir("sharded_ckpt_damaged");
  int port = testing::free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, 2, port);
    ShardedDataParallel sdp(make_seq(1), pg, {.stage = 1});
    torch::optim::SGD opt(sdp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    ShardedCheckpoint ckpt({.dir = dir, .keep = 2}, pg);
    for (int step = 1; step <= 3; ++step) {
      testing::train_sharded_steps(sdp, opt, rank, 2, step - 1, step);
      TrainingProgress at;
      at.step = step;
      ckpt.save(sdp, &opt, at);
    }
  }, 60s));
  ASSERT_FALSE(fs::exists(dir + "/step-000001")) << "keep = 2 kept the oldest";
  {  // a flipped byte in the middle of rank 1's shard of step 3
    const std::string victim = dir + "/step-000003/shard-00001-of-00002.safetensors";
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(victim) / 2));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(fs::file_size(victim) / 2));
    c = static_cast<char>(c ^ 0x5a);
    f.write(&c, 1);
  }
  port = testing::free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, 2, port);
    ShardedDataParallel sdp(make_seq(2), pg, {.stage = 3});
    torch::optim::SGD opt(sdp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    ShardedCheckpoint ckpt({.dir = dir}, pg);
    auto loaded = ckpt.load_latest(sdp, &opt);
    RANK_CHECK(loaded && loaded->progress.step == 2, "loaded {}", loaded ? loaded->path : "none");
    if (rank == 0)
      RANK_CHECK(loaded->skipped.size() == 1 &&
                     loaded->skipped[0].find("shard-00001-of-00002.safetensors is corrupt") !=
                         std::string::npos,
                 "skipped: {}", fmt::join(loaded->skipped, "; "));
  }, 60s));
  fs::remove_all(dir);
}

TEST(ShardedCheckpoint, AModelThatDoesNotFitAndARankThatCannotWriteFailEveryRank) {
  const std::string dir = fresh_dir("sharded_ckpt_refusals");
  int port = testing::free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, 2, port);
    ShardedDataParallel sdp(make_seq(1), pg, {.stage = 3});
    torch::optim::Adam opt(sdp.parameters(), 0.01);
    ShardedCheckpoint ckpt({.dir = dir}, pg);
    TrainingProgress at;
    at.step = 1;
    ckpt.save(sdp, &opt, at);

    // Rank 1 cannot see rank 0's directory (as on hosts without a shared filesystem).
    ShardedCheckpoint split({.dir = rank == 0 ? dir : "/proc/no-such-dir/ckpt"}, pg);
    at.step = 2;
    try {
      split.save(sdp, &opt, at);
      throw std::runtime_error("a save that rank 1 could not write succeeded");
    } catch (const InvalidArgumentError& e) {
      const std::string text = e.what();
      RANK_CHECK(text.find("rank 1: writing its shard shard-00001-of-00002.safetensors") !=
                     std::string::npos,
                 "{}", text);
    }
    RANK_CHECK(!fs::exists(dir + "/step-000002"), "the failed save left a checkpoint");

    // Another model, another optimizer.
    auto wide = torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::ReLU(),
                                      torch::nn::Linear(32, 16), torch::nn::Tanh(),
                                      torch::nn::Linear(16, 4));
    ShardedDataParallel other(wide, pg, {.stage = 2});
    torch::optim::Adam other_opt(other.parameters(), 0.01);
    try {
      ckpt.load_latest(other, &other_opt);
      throw std::runtime_error("a checkpoint of another model was loaded");
    } catch (const InvalidArgumentError& e) {
      RANK_CHECK(std::string(e.what()).find("'0.weight' has shape [16, 8] in the checkpoint, "
                                            "[32, 8] in the model") != std::string::npos,
                 "{}", e.what());
    }
    torch::optim::SGD sgd(sdp.parameters(), 0.1);
    try {
      ckpt.load_latest(sdp, &sgd);
      throw std::runtime_error("Adam's state was loaded into SGD");
    } catch (const InvalidArgumentError& e) {
      RANK_CHECK(std::string(e.what()).find("the optimizer to restore is SGD") != std::string::npos,
                 "{}", e.what());
    }
  }, 60s));
  EXPECT_TRUE(std::none_of(fs::directory_iterator(dir), fs::directory_iterator(),
                           [](const auto& e) {
                             return e.path().filename().string().rfind(".step-", 0) == 0;
                           }))
      << "a temporary directory was left behind";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dtrain
