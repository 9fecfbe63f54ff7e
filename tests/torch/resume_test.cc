// End to end: train_fashion_mnist under `dtrain run`, stopped after a checkpoint and started
// again on the same directory.
//  * Same world size, --deterministic: the resumed run ends with a --save file byte-identical to
//    that of a run that never stopped (DDP and the distributed optimizer).
//  * 3 ranks stopped mid-epoch, resumed on 2: the sample logs of both runs hold every sample of
//    the epoch exactly once.
// Small runs (--train-samples) keep each case to a few seconds.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "support/temp_dir.h"
#include "torch/example_run.h"
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;

const std::string kBin = DTRAIN_BIN_DIR;

using dtrain::testing::result_of;
using dtrain::testing::run_command;
using dtrain::testing::RunResult;

RunResult train(int ranks, const std::string& flags) {
  return run_command("timeout 120 " + kBin + "/dtrain run -n " + std::to_string(ranks) +
                     " --no-prefix -- " + kBin + "/train_fashion_mnist --threads 1 " + flags);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

using dtrain::testing::TempDir;

bool have_dataset() {
  return fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
}

// 2 epochs of 2000 samples on 2 ranks, batches of 50: 20 steps an epoch, 40 in all. The stopped
// run stops at step 25, in the middle of the second epoch, between two periodic checkpoints.
void check_exact_resume(const std::string& strategy) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  TempDir tmp;
  const std::string common = "--strategy " + strategy +
                             " --deterministic --epochs 2 --train-samples 2000 --batch-size 50 "
                             "--checkpoint-every 10 ";
  RunResult whole = train(2, common + "--checkpoint-dir " + tmp.path + "/whole --save " + tmp.path +
                                 "/whole.safetensors");
  ASSERT_EQ(whole.status, 0) << whole.output;

  const std::string dir = tmp.path + "/stopped";
  RunResult first = train(2, common + "--checkpoint-dir " + dir + " --stop-after-steps 25 --save " +
                                 tmp.path + "/never.safetensors");
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_NE(first.output.find("stopped after step 25 (--stop-after-steps); checkpoint " + dir +
                              "/step-000025"),
            std::string::npos)
      << first.output;
  EXPECT_TRUE(result_of(first.output).is_null()) << "a stopped run reports no RESULT";
  EXPECT_FALSE(fs::exists(tmp.path + "/never.safetensors"));
  EXPECT_TRUE(fs::exists(dir + "/step-000010") && fs::exists(dir + "/step-000020") &&
              fs::exists(dir + "/step-000025"));

  RunResult second =
      train(2, common + "--checkpoint-dir " + dir + " --save " + tmp.path + "/resumed.safetensors");
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from " + dir +
                               "/step-000025 (epoch 1, step 25, 500 of 2000 samples of the epoch "
                               "done, saved at world size 2)"),
            std::string::npos)
      << second.output;
  auto result = result_of(second.output);
  ASSERT_FALSE(result.is_null()) << second.output;
  EXPECT_EQ(result["steps"], 40);
  EXPECT_EQ(result["strategy"], strategy);
  auto whole_result = result_of(whole.output);
  EXPECT_EQ(result["test_accuracy"], whole_result["test_accuracy"]);
  EXPECT_EQ(result["initial_loss"], whole_result["initial_loss"]) << "restored from the checkpoint";

  const std::string a = read_file(tmp.path + "/whole.safetensors");
  const std::string b = read_file(tmp.path + "/resumed.safetensors");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the resumed run's parameters differ from the uninterrupted run's";
  // keep 3 (the default): 20, 25, 30, 40 were written by the second run's end
  EXPECT_FALSE(fs::exists(dir + "/step-000010"));
  EXPECT_TRUE(fs::exists(dir + "/step-000040"));
}

TEST(Resume, DdpStoppedAndResumedEndsBitIdentical) { check_exact_resume("ddp"); }
TEST(Resume, DistributedOptimizerStoppedAndResumedEndsBitIdentical) {
  check_exact_resume("optimizer");
}

// An epoch of 1800 samples in batches of 50 (`flags` says where they come from): 3 ranks stop
// after 5 steps (750 samples), 2 ranks train the other 1050 (525 each, 11 steps), and the sample
// logs of both runs hold every sample of the epoch exactly once. Returns the second run's RESULT.
nlohmann::json stop_on_three_resume_on_two(const TempDir& tmp, const std::string& flags) {
  const std::string log = tmp.path + "/samples.log";
  const std::string common = "--epochs 1 --batch-size 50 --checkpoint-dir " + tmp.path +
                             "/ckpt --sample-log " + log + " " + flags + " ";
  RunResult first = train(3, common + "--stop-after-steps 5");
  EXPECT_EQ(first.status, 0) << first.output;
  RunResult second = train(2, common);
  EXPECT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("/step-000005 (epoch 0, step 5, 750 of 1800 samples of the epoch "
                               "done, saved at world size 3)"),
            std::string::npos)
      << second.output;
  auto result = result_of(second.output);
  EXPECT_FALSE(result.is_null()) << second.output;
  if (!result.is_null()) {
    EXPECT_EQ(result["steps"], 16);
    EXPECT_EQ(result["world_size"], 2);
  }
  std::map<int64_t, int> count;
  std::istringstream lines(read_file(log));
  int64_t epoch = 0, index = 0, step = 0, restart = 0, total = 0;
  while (lines >> epoch >> index >> step >> restart) {  // nothing is trained twice here
    EXPECT_EQ(epoch, 0);
    ++count[index];
    ++total;
  }
  EXPECT_EQ(total, 1800);
  EXPECT_EQ(count.size(), 1800u);
  for (const auto& [i, c] : count)
    EXPECT_EQ(c, 1) << "sample " << i << " trained " << c << " times";
  EXPECT_EQ(count.begin()->first, 0);
  EXPECT_EQ(count.rbegin()->first, 1799);
  return result;
}

TEST(Resume, ThreeRanksStoppedMidEpochResumeOnTwoTrainingEverySampleOnce) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  TempDir tmp;
  stop_on_three_resume_on_two(tmp, "--train-samples 1800");
}

// Preempted as a cluster does it: SIGTERM to `dtrain run` once 10 steps are trained. Every rank
// stops after the same step, rank 0 saves it, the job exits 75 (requeue); run again, it resumes
// there and the two runs' sample logs hold every sample exactly once.
TEST(Resume, PreemptedBySigtermResumesTrainingEverySampleOnce) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  TempDir tmp;
  const std::string log = tmp.path + "/samples.log";
  const std::string flags = "--threads 1 --epochs 1 --batch-size 50 --train-samples 12000 "
                            "--checkpoint-dir " + tmp.path + "/ckpt --sample-log " + log;
  // --grace-period: time to finish the step and write the checkpoint before SIGKILL.
  const std::string launch = kBin + "/dtrain run -n 2 --grace-period 60 --no-prefix -- " + kBin +
                             "/train_fashion_mnist " + flags;
  // The launcher in the background; the shell waits for 1000 logged samples (10 steps), warns it
  // and reports its exit status.
  RunResult first = run_command(
      "timeout 120 sh -c '" + launch + " & p=$!; n=0; while [ \"$n\" -lt 1000 ]; do sleep 0.05; "
      "n=$(cat " + log + " 2>/dev/null | wc -l); done; kill -TERM $p; wait $p; "
      "echo \"launcher exit $?\"'");
  EXPECT_NE(first.output.find("launcher exit 75"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("(preempted: run again to resume)"), std::string::npos)
      << first.output;
  RunResult second = run_command("timeout 120 " + launch);
  EXPECT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;
  std::map<int64_t, int> count;
  std::istringstream lines(read_file(log));
  int64_t epoch = 0, index = 0, step = 0, restart = 0, total = 0;
  while (lines >> epoch >> index >> step >> restart) ++count[index], ++total;
  EXPECT_EQ(total, 12000);
  EXPECT_EQ(count.size(), 12000u);
  for (const auto& [i, c] : count)
    EXPECT_EQ(c, 1) << "sample " << i << " trained " << c << " times";
}

// The same from TFRecord shards (`dtrain data write --fashion-mnist`, 1800 images in 3 files),
// read by ShardedDataset; and a checkpoint of a run on shards does not resume one in memory.
TEST(Resume, FromShardsThreeRanksStoppedMidEpochResumeOnTwoTrainingEveryRecordOnce) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  TempDir tmp;
  RunResult written = run_command(kBin + "/dtrain data write --fashion-mnist --limit 1800 --out " +
                                  tmp.path + "/shards/train --shards 3");
  ASSERT_EQ(written.status, 0) << written.output;
  const auto result = stop_on_three_resume_on_two(
      tmp, "--data-shards '" + tmp.path + "/shards/train-*.tfrecord'");
  ASSERT_FALSE(result.is_null());
  EXPECT_TRUE(result.contains("input_wait_ms_per_step")) << result.dump();
  EXPECT_GT(result["test_accuracy"].get<double>(), 0.3) << result.dump();

  RunResult mixed = train(2, "--epochs 1 --train-samples 1800 --batch-size 50 --checkpoint-dir " +
                                 tmp.path + "/ckpt");
  EXPECT_NE(mixed.status, 0) << mixed.output;
  EXPECT_NE(mixed.output.find("shards 1; this run has 1800, seed 42, shuffle 1, shards 0"),
            std::string::npos)
      << mixed.output;
}

}  // namespace
