// End to end: examples/train_pipeline under `dtrain run`. Cut into 4 stages it trains exactly as
// one process does (the same loss and accuracy); as 2 stages x 2 replicas with zb-h1 it learns as
// well; killed after a checkpoint and run again, it ends with the parameters of a run that never
// stopped.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "torch/example_run.h"

namespace {

const std::string kBin = DTRAIN_BIN_DIR;

bool have_dataset() {
  return std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
}

using dtrain::testing::result_of;

// The output of `command`; its exit status in `status`.
std::string run_command(const std::string& command, int& status) {
  auto r = dtrain::testing::run_command(command);
  status = r.status;
  return r.output;
}

// train_pipeline on `n` ranks (1: without dtrain run) with `flags`; its RESULT (and its output).
nlohmann::json train(int n, const std::string& flags, std::string* printed = nullptr) {
  const std::string program = kBin + "/train_pipeline --train-samples 6000 --threads 1 " + flags;
  const std::string command =
      "timeout 200 " +
      (n == 1 ? program : kBin + "/dtrain run -n " + std::to_string(n) + " --no-prefix -- " + program) +
      " 2>&1";
  int status = -1;
  std::string output = run_command(command, status);
  EXPECT_EQ(status, 0) << command << "\n" << output;
  auto result = result_of(output);
  EXPECT_FALSE(result.is_null()) << "no RESULT line in:\n" << output;
  if (printed != nullptr) *printed = output;
  return result;
}

TEST(TrainPipeline, FourStagesTrainAsOneProcessDoes) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  auto one = train(1, "");
  auto four = train(4, "--stages 4");
  ASSERT_FALSE(one.is_null());
  ASSERT_FALSE(four.is_null());
  EXPECT_EQ(four["stages"], 4);
  EXPECT_EQ(four["replicas"], 1);
  EXPECT_EQ(four["steps"], one["steps"]);
  EXPECT_LT(one["final_loss"].get<double>(), one["initial_loss"].get<double>() * 0.6);
  EXPECT_GT(one["test_accuracy"].get<double>(), 0.6);
  // The same arithmetic in another place: equal to rounding (the micro-batch sums may differ in
  // the last bits from one process's).
  EXPECT_NEAR(four["final_loss"].get<double>(), one["final_loss"].get<double>(), 1e-3);
  EXPECT_NEAR(four["test_accuracy"].get<double>(), one["test_accuracy"].get<double>(), 0.01);
  EXPECT_EQ(four["peak_microbatches"], nlohmann::json::parse("[4,3,2,1]")) << "1F1B's memory";
  // Each stage holds its share of the parameters, not the model.
  int64_t total = 0;
  for (const auto& p : four["stage_parameters"]) total += p.get<int64_t>();
  for (const auto& p : four["stage_parameters"]) EXPECT_LT(p.get<int64_t>(), total / 2);
}

TEST(TrainPipeline, TwoStagesTimesTwoReplicasLearnAsWell) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  // Each replica takes 32 images a step: the global batch of one process's 64.
  auto one = train(1, "");
  auto grid = train(4, "--stages 2 --schedule zb-h1 --batch-size 32");
  ASSERT_FALSE(grid.is_null());
  EXPECT_EQ(grid["replicas"], 2);
  EXPECT_EQ(grid["schedule"], "zb-h1");
  EXPECT_NEAR(grid["test_accuracy"].get<double>(), one["test_accuracy"].get<double>(), 0.03);
}

TEST(TrainPipeline, ResumedAfterAStopEndsWithTheParametersOfAnUnbrokenRun) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const std::string dir = ::testing::TempDir() + "/pipeline_ckpt_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const std::string common = "--stages 2 --schedule 1f1b --checkpoint-every 10 ";
  auto unbroken = train(2, common + "--checkpoint-dir " + dir + "/a");
  // Stops (as a preempted job would) after step 25: the newest checkpoint is of step 25.
  int status = -1;
  std::string out = run_command("timeout 200 " + kBin + "/dtrain run -n 2 --no-prefix -- " + kBin +
                                    "/train_pipeline --train-samples 6000 --threads 1 " + common +
                                    "--checkpoint-dir " + dir + "/b --stop-after-steps 25 2>&1",
                                status);
  ASSERT_EQ(status, 0) << out;
  ASSERT_NE(out.find("stopped after step 25"), std::string::npos) << out;
  std::string printed;
  auto resumed = train(2, common + "--checkpoint-dir " + dir + "/b", &printed);
  EXPECT_NE(printed.find("resumed from " + dir + "/b/pipeline-0-of-2/step-000025 (epoch 0, step 25"),
            std::string::npos)
      << printed;
  ASSERT_FALSE(unbroken.is_null());
  ASSERT_FALSE(resumed.is_null());
  EXPECT_EQ(resumed["steps"], unbroken["steps"]);
  EXPECT_EQ(resumed["parameter_sum"].get<double>(), unbroken["parameter_sum"].get<double>())
      << "exact resume: the same parameters, bit for bit";
  // A directory of a 2-stage job is refused by a 4-stage one, naming both.
  out = run_command("timeout 200 " + kBin + "/dtrain run -n 4 --no-prefix -- " + kBin +
                        "/train_pipeline --train-samples 3000 --threads 1 --stages 4 "
                        "--checkpoint-dir " + dir + "/b 2>&1",
                    status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("holds checkpoints of a pipeline of 2 ranks; this job has 4"), std::string::npos)
      << out;
  std::filesystem::remove_all(dir);
}

}  // namespace
