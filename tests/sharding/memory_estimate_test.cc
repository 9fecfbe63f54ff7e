// The estimator against ZeRO's own figures (16 bytes a parameter with Adam, 4 + 12/N at stage 1,
// 2 + 14/N at stage 2, 16/N at stage 3 in mixed precision), and `dtrain estimate` as a user runs it.
#include "dtrain/memory_estimate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "common/safetensors_file.h"
#include "dtrain/error.h"
#include "launch/command.h"

namespace dtrain {
namespace {

constexpr int64_t kP = 100'000'000;

MemoryEstimate of(const std::string& layout, const std::string& precision = "fp32",
                  const std::string& optimizer = "adam", int n = 4) {
  return estimate_memory({.parameters = kP, .optimizer = optimizer, .precision = precision,
                          .world_size = n, .layout = layout});
}

TEST(MemoryEstimate, ZeroStagesInMixedPrecisionAreThePapers) {
  // ZeRO (Rajbhandari et al., 2020), section 3: Adam in mixed precision keeps 2 + 2 + 12 bytes a
  // parameter; each stage shards one more of them over N.
  EXPECT_EQ(of("zero1", "bf16").model_states(), kP * 4 + kP * 12 / 4);
  EXPECT_EQ(of("zero2", "bf16").model_states(), kP * 2 + kP * 14 / 4);
  EXPECT_EQ(of("zero3", "bf16").model_states(), kP * 16 / 4);
  // DDP: the 16 bytes, and the buckets dtrain's DDP reduces gradients in.
  EXPECT_EQ(of("ddp", "bf16").model_states(), kP * 16 + kP * 2);
}

TEST(MemoryEstimate, Fp32AndOptimizers) {
  EXPECT_EQ(of("ddp").parameters, kP * 4);
  EXPECT_EQ(of("ddp").optimizer, kP * 8);
  EXPECT_EQ(of("ddp", "fp32", "sgd").optimizer, 0);
  EXPECT_EQ(of("ddp", "fp32", "momentum").optimizer, kP * 4);
  EXPECT_EQ(of("zero3").model_states(), kP * 16 / 4);
  EXPECT_EQ(of("tp").model_states(), of("pp").model_states());
  // fp32: dtrain's stages 1 and 2 keep each rank's shard and its gradient besides.
  EXPECT_EQ(of("zero1").model_states(), kP * 8 + kP * 16 / 4);
  EXPECT_EQ(of("zero2").model_states(), kP * 4 + kP * 16 / 4);
  EXPECT_EQ(of("zero1", "fp32", "adam", 1).model_states(), of("ddp", "fp32", "adam", 1).model_states() + kP * 4)
      << "one rank: a master shard and its gradient (8 B) against DDP's buckets (4 B)";
}

TEST(MemoryEstimate, GatheredUnitAndActivations) {
  auto e = estimate_memory({.parameters = kP, .world_size = 4, .layout = "zero3",
                            .largest_unit = 1'000'000, .batch = 32,
                            .activation_bytes_per_sample = 1000});
  EXPECT_EQ(e.gathered, 1'000'000 * 4 * 5 + 1'000'000);  // 5 units held, + a shard (1/4)
  EXPECT_EQ(e.activations, 32 * 1000);
  EXPECT_EQ(e.total(), e.model_states() + 32 * 1000);
  // A pipeline of 4 stages, 8 micro-batches of 4: the first stage holds 4 in flight, each with a
  // quarter of a sample's activations.
  auto p = estimate_memory({.parameters = kP, .world_size = 4, .layout = "pp", .batch = 32,
                            .activation_bytes_per_sample = 1000, .microbatches = 8});
  EXPECT_EQ(p.activations, 4 * 4 * 250);
}

TEST(MemoryEstimate, BadOptionsAreNamed) {
  auto message = [](const MemoryEstimateOptions& o) {
    try {
      estimate_memory(o);
    } catch (const InvalidArgumentError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message({.parameters = 1, .precision = "fp8"}).find("precision 'fp8' is unknown"),
            std::string::npos);
  EXPECT_NE(message({.parameters = 1, .optimizer = "lion"}).find("optimizer 'lion'"), std::string::npos);
  EXPECT_NE(message({.parameters = 1, .layout = "zero4"}).find("layout 'zero4' is unknown"),
            std::string::npos);
  EXPECT_NE(message({.parameters = int64_t{1} << 62}).find("overflows"), std::string::npos);
}

const std::string kDtrain = std::string(DTRAIN_BIN_DIR) + "/dtrain";

// The line of `output` that starts with `name`.
std::string line_of(const std::string& output, const std::string& name) {
  const size_t at = output.find("\n" + name);
  if (at == std::string::npos) return "";
  return output.substr(at + 1, output.find('\n', at + 1) - at - 1);
}

TEST(EstimateCommand, PrintsTheModelStatesLine) {
  auto r = testing::run_command({kDtrain, "estimate", "--params", "100000000", "--optimizer",
                                 "adam", "--precision", "fp32", "--world-size", "4", "--layout",
                                 "zero3"});
  ASSERT_TRUE(r.ok()) << r.output;
  // In bytes and in MiB, as every other row.
  EXPECT_EQ(line_of(r.output, "model states"), "model states          400000000   381.5 MiB")
      << r.output;
  // The counts people write: 7B, 7e9, 100M.
  for (const char* count : {"1e8", "100M", "0.1B"}) {
    auto same = testing::run_command({kDtrain, "estimate", "--params", count, "--optimizer",
                                      "adam", "--world-size", "4", "--layout", "zero3"});
    ASSERT_TRUE(same.ok()) << same.output;
    EXPECT_NE(same.output.find("100000000 parameters"), std::string::npos) << same.output;
  }
  auto seven = testing::run_command({kDtrain, "estimate", "--params", "7B", "--world-size", "8"});
  ASSERT_TRUE(seven.ok()) << seven.output;
  EXPECT_NE(seven.output.find("7000000000 parameters"), std::string::npos) << seven.output;
  EXPECT_EQ(seven.output.find(" 1400"), std::string::npos) << "raw bytes beside MiB:\n"
                                                           << seven.output;
  auto bad = testing::run_command({kDtrain, "estimate", "--params", "7X"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--params: '7X' is not a count"), std::string::npos) << bad.output;
  // A world of one shards nothing: said, not left to be inferred from equal columns.
  auto one = testing::run_command({kDtrain, "estimate", "--params", "1M", "--layout", "zero3"});
  ASSERT_TRUE(one.ok()) << one.output;
  EXPECT_NE(one.output.find("a world of one shards and cuts nothing"), std::string::npos)
      << one.output;
  auto all = testing::run_command({kDtrain, "estimate", "--params", "1000", "--world-size", "2"});
  ASSERT_TRUE(all.ok()) << all.output;
  EXPECT_NE(all.output.find("model states"), std::string::npos);
  for (const char* layout : {"ddp", "zero1", "zero2", "zero3", "tp", "pp"})
    EXPECT_NE(all.output.find(layout), std::string::npos) << layout;
}

TEST(EstimateCommand, CountsASafetensorsModel) {
  const std::string path = ::testing::TempDir() + "/estimate_" + std::to_string(::getpid()) +
                           ".safetensors";
  std::vector<SafetensorsEntry> entries = {
      {"fc1.weight", "F32", {100, 50}, std::vector<std::byte>(100 * 50 * 4)},
      {"fc1.bias", "F32", {100}, std::vector<std::byte>(100 * 4)},
      {"fc2.weight", "F32", {10, 100}, std::vector<std::byte>(10 * 100 * 4)}};
  write_safetensors_file(path, entries);
  auto r = testing::run_command({kDtrain, "estimate", "--model", path, "--world-size", "2",
                                 "--layout", "zero3", "--optimizer", "sgd"});
  std::filesystem::remove(path);
  ASSERT_TRUE(r.ok()) << r.output;
  EXPECT_NE(r.output.find("6100 parameters"), std::string::npos) << r.output;
  // (6100 x 4 + 6100 x 4) / 2 sharded + the largest unit (fc1: 5000 + 100) x 4 B x 5 held in
  // backward + its shard (5100 x 4 B / 2).
  EXPECT_NE(line_of(r.output, "model states").find(" 136600 "), std::string::npos) << r.output;
  // The same model as a list of layers.
  auto layers = testing::run_command({kDtrain, "estimate", "--layers", "5.1K,1000", "--world-size",
                                      "2", "--layout", "zero3", "--optimizer", "sgd"});
  ASSERT_TRUE(layers.ok()) << layers.output;
  EXPECT_NE(line_of(layers.output, "model states").find(" 136600 "), std::string::npos)
      << layers.output;
  auto none = testing::run_command({kDtrain, "estimate"});
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.output.find("give --params N, --layers N,N,... or --model"), std::string::npos)
      << none.output;
}

}  // namespace
}  // namespace dtrain
