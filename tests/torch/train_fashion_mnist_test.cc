// End to end: the example under `dtrain run -n 2` for a few dozen steps; the loss must fall, for
// every strategy (DDP, the distributed optimizer, the parameter server); and from damaged shards.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "torch/example_run.h"

namespace {

using dtrain::testing::result_of;

// The output of `command`; its exit status in `status`.
std::string run_command(const std::string& command, int& status) {
  auto r = dtrain::testing::run_command(command);
  status = r.status;
  return r.output;
}

// `launch` goes between `dtrain run` and `-n 2` (e.g. "--servers 1"); `extra` after the strategy.
void check_loss_falls(const std::string& strategy, const std::string& launch = "",
                      const std::string& extra = "") {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const std::string bin = DTRAIN_BIN_DIR;
  const std::string command = "timeout 200 " + bin + "/dtrain run " + launch +
                              " -n 2 --no-prefix -- " + bin +
                              "/train_fashion_mnist --strategy " + strategy + " " + extra +
                              " --max-steps 60 --threads 1 2>&1";
  int status = -1;
  std::string output = run_command(command, status);
  ASSERT_EQ(status, 0) << output;
  auto result = result_of(output);
  ASSERT_FALSE(result.is_null()) << "no RESULT line in:\n" << output;
  EXPECT_EQ(result["world_size"], 2);
  EXPECT_EQ(result["strategy"], strategy);
  EXPECT_EQ(result["steps"], 60);
  const double initial = result["initial_loss"], final_loss = result["final_loss"];
  EXPECT_GT(initial, 2.0) << "an untrained 10-class model starts near ln 10 = 2.30";
  EXPECT_LT(final_loss, initial * 0.6) << output;
  EXPECT_GT(result["test_accuracy"].get<double>(), 0.5) << output;
  EXPECT_GT(result["images_per_sec"].get<double>(), 0.0);
}

TEST(TrainFashionMnist, DdpLossFallsUnderTwoRanks) { check_loss_falls("ddp"); }
TEST(TrainFashionMnist, DistributedOptimizerLossFallsUnderTwoRanks) { check_loss_falls("optimizer"); }
// Through one parameter server, bounded staleness, one worker slowed down.
TEST(TrainFashionMnist, ParameterServerLossFallsWithAStraggler) {
  check_loss_falls("ps", "--servers 1",
                   "--ps-mode ssp --staleness 2 --straggler-rank 1 --straggler-ms 5");
}

// From TFRecord shards with one damaged record: by default the job fails naming the file and the
// record; with --skip-bad-records it trains without it and says so, in the log and in RESULT.
TEST(TrainFashionMnist, ADamagedShardFailsTheJobOrIsSkippedAndCounted) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const std::string bin = DTRAIN_BIN_DIR;
  const std::string dir = ::testing::TempDir() + "/fmnist_bad_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  int status = -1;
  std::string out = run_command(bin + "/dtrain data write --fashion-mnist --limit 600 --out " +
                                    dir + "/train --shards 2 2>&1",
                                status);
  ASSERT_EQ(status, 0) << out;
  const std::string damaged = dir + "/train-00001-of-00002.tfrecord";
  {
    std::fstream io(damaged, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(100);  // inside the data of the file's first record
    io.put('#');
  }
  const std::string train = "timeout 200 " + bin + "/dtrain run -n 2 --no-prefix -- " + bin +
                            "/train_fashion_mnist --batch-size 50 --threads 1 --data-shards '" +
                            dir + "/train-*.tfrecord' ";
  out = run_command(train + "2>&1", status);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("TFRecord file " + damaged + ": record 0 at byte 0"), std::string::npos)
      << out;
  out = run_command(train + "--skip-bad-records 2>&1", status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("trained without a bad record: TFRecord file " + damaged + ": record 0"),
            std::string::npos)
      << out;
  auto result = result_of(out);
  ASSERT_FALSE(result.is_null()) << out;
  EXPECT_EQ(result["bad_records_skipped"], 1) << out;
  EXPECT_EQ(result["steps"], 6);
  std::filesystem::remove_all(dir);
}

}  // namespace
