// End to end: examples/train_sharded under `dtrain run`. ZeRO-3 on 2 ranks learns; stopped after
// a checkpoint and run again it ends with the parameters of a run that never stopped; its last
// checkpoint resumes at 3 ranks and stage 2.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "torch/example_run.h"

namespace {

const std::string kBin = DTRAIN_BIN_DIR;

bool have_dataset() {
  return std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
}

// train_sharded on `n` ranks with `flags`; its output, and its RESULT in `result`.
std::string train(int n, const std::string& flags, nlohmann::json* result) {
  const std::string command = "timeout 200 " + kBin + "/dtrain run -n " + std::to_string(n) +
                              " --no-prefix -- " + kBin +
                              "/train_sharded --train-samples 6000 --threads 1 " + flags;
  auto r = dtrain::testing::run_command(command);
  EXPECT_EQ(r.status, 0) << command << "\n" << r.output;
  if (result != nullptr) {
    *result = dtrain::testing::result_of(r.output);
    EXPECT_FALSE(result->is_null()) << "no RESULT line in:\n" << r.output;
  }
  return r.output;
}

TEST(TrainSharded, LearnsResumesExactlyAndReshards) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const std::string dir = ::testing::TempDir() + "/train_sharded_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);

  nlohmann::json whole;
  train(2, "--stage 3", &whole);
  ASSERT_FALSE(whole.is_null());
  EXPECT_EQ(whole["strategy"], "zero3");
  EXPECT_LT(whole["final_loss"].get<double>(), whole["initial_loss"].get<double>() * 0.6);
  EXPECT_GT(whole["test_accuracy"].get<double>(), 0.6);

  // Stopped at step 20 (a checkpoint every 10 steps), then run again to the end.
  const std::string ckpt = "--stage 3 --checkpoint-dir " + dir + " --checkpoint-every 10";
  std::string out = train(2, ckpt + " --stop-after-steps 20", nullptr);
  EXPECT_NE(out.find("stopped after step 20"), std::string::npos) << out;
  nlohmann::json resumed;
  out = train(2, ckpt, &resumed);
  EXPECT_NE(out.find("resumed from " + dir + "/step-000020 (saved at 2 rank(s)"),
            std::string::npos)
      << out;
  ASSERT_FALSE(resumed.is_null());
  EXPECT_EQ(resumed["steps"], whole["steps"]);
  EXPECT_EQ(resumed["parameter_sum"], whole["parameter_sum"]) << "not an exact resume";

  // The last checkpoint of that run (step 40) at 3 ranks and stage 2.
  nlohmann::json three;
  out = train(3, "--stage 2 --checkpoint-dir " + dir + " --checkpoint-every 1000", &three);
  EXPECT_NE(out.find("resumed from " + dir + "/step-000040 (saved at 2 rank(s)"),
            std::string::npos)
      << out;
  ASSERT_FALSE(three.is_null());
  EXPECT_EQ(three["world_size"], 3);
  EXPECT_GT(three["steps"].get<int64_t>(), 40);
  EXPECT_GT(three["test_accuracy"].get<double>(), 0.6);
  std::filesystem::remove_all(dir);
}

}  // namespace
