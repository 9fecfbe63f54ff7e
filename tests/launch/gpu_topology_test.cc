// GPU placement on a node from its topology (recorded `nvidia-smi topo -m` matrices in
// tests/launch/topologies/), and `dtrain run --gpus-per-proc` giving each worker its set.
#include "launch/gpu_topology.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "dtrain/error.h"
#include "launch/command.h"

namespace dtrain::launch {
namespace {

const std::string kTopologies = std::string(DTRAIN_SOURCE_DIR) + "/tests/launch/topologies/";

GpuTopology load(const std::string& name) {
  std::ifstream in(kTopologies + name);
  std::stringstream text;
  text << in.rdbuf();
  return parse_nvidia_smi_topo(text.str());
}

using Sets = std::vector<std::vector<int>>;

TEST(GpuTopology, ParsesTheMatrixAffinityAndNumaSkippingNics) {
  const auto dgx1 = load("dgx1_v100.txt");
  ASSERT_EQ(dgx1.gpus(), 8);
  EXPECT_EQ(dgx1.link[0][3], "NV2");
  EXPECT_EQ(dgx1.link[0][5], "SYS");
  EXPECT_EQ(dgx1.cpus[0].size(), 40u);  // 0-19,40-59
  EXPECT_EQ(dgx1.cpus[4].front(), 20);
  EXPECT_EQ(dgx1.numa[7], 1);
  const auto h100 = load("dgx_h100.txt");  // NIC columns and rows around the GPUs
  ASSERT_EQ(h100.gpus(), 8);
  EXPECT_EQ(h100.link[2][6], "NV18");
  EXPECT_EQ(h100.numa[5], 1);
}

TEST(GpuTopology, EachRankGetsTheClosestSetLeft) {
  const auto dgx1 = load("dgx1_v100.txt");
  // Quads: each half of the cube-mesh is all NVLink; across them it is not.
  EXPECT_EQ(pick_gpu_sets(dgx1, 2, 4), (Sets{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  // Pairs: the double links (NV2) first.
  EXPECT_EQ(pick_gpu_sets(dgx1, 4, 2), (Sets{{0, 3}, {1, 2}, {4, 7}, {5, 6}}));
  const auto pcie = load("pcie_8gpu.txt");
  EXPECT_EQ(pick_gpu_sets(pcie, 4, 2), (Sets{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));  // one switch
  EXPECT_EQ(pick_gpu_sets(pcie, 2, 4), (Sets{{0, 1, 2, 3}, {4, 5, 6, 7}}));      // one socket
  EXPECT_EQ(pick_gpu_sets(pcie, 8, 1)[7], (std::vector<int>{7}));
  const auto h100 = load("dgx_h100.txt");
  EXPECT_EQ(pick_gpu_sets(h100, 1, 8), (Sets{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_GT(link_score("NV18"), link_score("NV2"));
  EXPECT_GT(link_score("NV1"), link_score("PIX"));
  EXPECT_GT(link_score("PXB"), link_score("PHB"));
  EXPECT_GT(link_score("NODE"), link_score("SYS"));
}

TEST(GpuTopology, BadInputIsNamed) {
  try {
    pick_gpu_sets(load("pcie_8gpu.txt"), 3, 3);
    FAIL() << "accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("3 rank(s) x 3 GPU(s) each need 9 GPUs; this node has 8"),
              std::string::npos)
        << e.what();
  }
  try {
    parse_nvidia_smi_topo("\tGPU0\tGPU1\nGPU0\t X \tQPI\nGPU1\tQPI\t X \n");
    FAIL() << "accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("line 2: unknown link 'QPI' between GPU0 and GPU1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_nvidia_smi_topo("No devices were found\n"), InvalidArgumentError);
  EXPECT_EQ(parse_cpu_list("0-2,7"), (std::vector<int>{0, 1, 2, 7}));
  EXPECT_THROW(parse_cpu_list("3-1"), InvalidArgumentError);
  EXPECT_THROW(parse_cpu_list("all"), InvalidArgumentError);
}

// `dtrain run --gpus-per-proc 2` on the DGX-1's matrix: each worker sees its pair in
// CUDA_VISIBLE_DEVICES, and the launcher says which GPUs and links each local rank got.
TEST(GpuTopology, DtrainRunGivesEachWorkerItsSet) {
  testing::CommandOptions o;
  o.env["DTRAIN_GPU_TOPOLOGY"] = kTopologies + "dgx1_v100.txt";
  auto r = testing::run_command(
      {std::string(DTRAIN_BIN_DIR) + "/dtrain", "run", "-n", "4", "--master-port", "0",
       "--gpus-per-proc", "2", "--", "sh", "-c", "echo \"devices $RANK=$CUDA_VISIBLE_DEVICES\""},
      o);
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  for (const char* line : {"devices 0=0,3", "devices 1=1,2", "devices 2=4,7", "devices 3=5,6",
                           "local rank 0: GPUs 0,3 (NV2)"})
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  r = testing::run_command({std::string(DTRAIN_BIN_DIR) + "/dtrain", "run", "-n", "5",
                            "--master-port", "0", "--gpus-per-proc", "2", "--", "true"},
                           o);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("5 rank(s) x 2 GPU(s) each need 10 GPUs; this node has 8"),
            std::string::npos)
      << r.output;
  o.env["DTRAIN_GPU_TOPOLOGY"] = "/nonexistent";
  r = testing::run_command({std::string(DTRAIN_BIN_DIR) + "/dtrain", "run", "-n", "1",
                            "--gpus-per-proc", "1", "--", "true"},
                           o);
  EXPECT_NE(r.output.find("cannot read DTRAIN_GPU_TOPOLOGY=/nonexistent"), std::string::npos)
      << r.output;
}

// Under the elastic agent (--max-restarts): every round gives each local rank the same set.
TEST(GpuTopology, AnElasticRunKeepsEachLocalRanksSetAcrossRestarts) {
  testing::CommandOptions o;
  o.env["DTRAIN_GPU_TOPOLOGY"] = kTopologies + "dgx1_v100.txt";
  auto r = testing::run_command(
      {std::string(DTRAIN_BIN_DIR) + "/dtrain", "run", "-n", "2", "--max-restarts", "1",
       "--gpus-per-proc", "2", "--", "sh", "-c",
       "echo \"round $DTRAIN_RESTART_COUNT devices $RANK=$CUDA_VISIBLE_DEVICES\"; "
       "[ \"$DTRAIN_RESTART_COUNT$RANK\" = 01 ] && exit 3; exit 0"},
      o);
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  for (const char* line : {"round 0 devices 0=0,3", "round 0 devices 1=1,2",
                           "round 1 devices 0=0,3", "round 1 devices 1=1,2"})
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
}

}  // namespace
}  // namespace dtrain::launch
