// The workload and trace parsers on malformed input (every error names FILE:LINE and the
// column), the job-table selection, and `dtrain sched-sim` run as a user runs it.
#include "scheduling/workload.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "dtrain/error.h"
#include "launch/command.h"
#include "scheduling/application.h"

namespace dtrain::scheduling {
namespace {

std::string write(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/sched_" + name;
  std::ofstream(path) << text;
  return path;
}

void expect_error(const std::string& path, const std::string& needle,
                  const WorkloadOptions& o = {}) {
  try {
    read_workload(path, o);
    ADD_FAILURE() << "accepted " << path;
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(SchedSimWorkload, ReadsPolluxsWorkloadsSortedBySubmission) {
  const auto jobs = read_workload(write(
      "ok.csv",
      "name,time,application,num_replicas,batch_size\nb,20,cifar10,2,256\na,5.0,ncf,1,32768\n"));
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].name, "a");
  EXPECT_EQ(jobs[0].gpus, 1);
  EXPECT_EQ(jobs[1].application, "cifar10");
  EXPECT_EQ(jobs[1].batch_size, 256);
}

TEST(SchedSimWorkload, MalformedRowsAreNamedByLineAndColumn) {
  const std::string header = "name,time,application,num_replicas,batch_size\n";
  expect_error(write("fields.csv", header + "a,0,cifar10,2,256\nb,1,cifar10,2\n"),
               "sched_fields.csv:3: 4 field(s) where the header has 5");
  expect_error(write("time.csv", header + "a,soon,cifar10,2,256\n"),
               "sched_time.csv:2: column 'time': 'soon' is not a finite number");
  expect_error(write("nan.csv", header + "a,nan,cifar10,2,256\n"), "'nan' is not a finite number");
  expect_error(write("gpus.csv", header + "a,0,cifar10,0,256\n"),
               "sched_gpus.csv:2: num_replicas 0 must be between 1");
  expect_error(write("frac.csv", header + "a,0,cifar10,2.5,256\n"),
               "column 'num_replicas': '2.5' is not a whole number");
  expect_error(write("negative.csv", header + "a,-5,cifar10,2,256\n"), "time -5 is negative");
  expect_error(write("batch.csv", header + "a,0,cifar10,8,4\n"),
               "batch_size 4 is smaller than num_replicas 8");
  expect_error(write("quote.csv", header + "\"a\",0,cifar10,2,256\n"),
               "quoted fields are not supported");
  expect_error(write("columns.csv", "who,when\nx,1\n"), "not a workload");
  expect_error(write("empty.csv", header), "has no jobs");
  expect_error(::testing::TempDir() + "/sched_absent.csv", "cannot read");
}

TEST(SchedSimWorkload, JobTablesAreSelectedByClusterAndTimeAndRebased) {
  const std::string path = write("philly.csv",
                                 "timestamp,duration,num_gpus,gpu_time,cluster\n"
                                 "2017-10-09 07:00:00,66.0,1,66.0,aa\n"
                                 "2017-10-09 06:00:00,3000.0,2,6000.0,aa\n"
                                 "2017-10-09 06:30:00,30.0,4,120.0,aa\n"
                                 "2017-10-09 06:10:00,500.0,8,4000.0,bb\n"
                                 "2017-10-10 06:00:00,100.0,1,100.0,aa\n");
  WorkloadOptions o;
  o.cluster = "aa";
  o.start = "2017-10-09 06:00:00";
  o.hours = 2;
  o.min_duration = 60;
  const auto jobs = read_workload(path, o);
  ASSERT_EQ(jobs.size(), 2u);  // bb, the 30 s job and the next day's are left out
  EXPECT_EQ(jobs[0].submit, 0);
  EXPECT_EQ(jobs[0].gpus, 2);
  EXPECT_EQ(jobs[0].duration, 3000);
  EXPECT_EQ(jobs[1].submit, 3600);
  EXPECT_EQ(jobs[1].name, "job-2");  // named after its line
  // Without a start, time counts from the first row selected, and so does the window.
  EXPECT_EQ(read_workload(path, {}).front().submit, 0);
  WorkloadOptions first_hour;
  first_hour.cluster = "aa";
  first_hour.hours = 1;
  const auto early = read_workload(path, first_hour);  // 06:00 and 06:30 of cluster aa
  ASSERT_EQ(early.size(), 2u);
  EXPECT_EQ(early[1].submit, 1800);
  o.start = "9 October";
  expect_error(path, "start '9 October' should read YYYY-MM-DD", o);
  expect_error(write("stamp.csv", "timestamp,duration,num_gpus\nyesterday,10,1\n"),
               "sched_stamp.csv:2: timestamp 'yesterday' should read");
  expect_error(write("dur.csv", "time,duration,num_gpus\n0,-1,1\n"),
               "sched_dur.csv:2: duration -1 must be positive");
  o = {};
  o.cluster = "zz";
  expect_error(path, "no job is left after the selection", o);
}

TEST(SchedSimWorkload, BadTracesAreNamedByFile) {
  namespace fs = std::filesystem;
  const std::string root = ::testing::TempDir() + "/sched_badtraces";
  fs::remove_all(root);
  fs::create_directories(root + "/app");
  std::ofstream(root + "/apps.csv") << "name,max_epochs\napp,3\n";
  std::ofstream(root + "/app/validation-32.csv")
      << "progress,iteration,metric,grad_sqr,grad_var\n1,1,1,1,1\n";
  std::ofstream(root + "/app/placements.csv")
      << "placement,local_bsz,step_time,sync_time\n1x,32,0.5,0\n";
  std::ofstream(root + "/app/scalability.csv")
      << "num_nodes,num_replicas,local_bsz,step_time,sync_time\n";
  auto expect_load_error = [&](const std::string& needle) {
    try {
      load_applications(root, root + "/apps.csv");
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_load_error("placements.csv:2: placement '1x' should be GPUs per node as digits");
  std::ofstream(root + "/app/placements.csv")
      << "placement,local_bsz,step_time,sync_time\n1,32,0.5,0.9\n";
  expect_load_error(
      "placements.csv:2: needs 1 <= local_bsz <= 1e7, 0 < step_time <= 1e6 s and 0 <= sync_time <= "
      "step_time");
  // Found by the fuzzer: a batch beyond any int was cast to one.
  std::ofstream(root + "/app/placements.csv")
      << "placement,local_bsz,step_time,sync_time\n1,3.2e42,0.5,0\n";
  expect_load_error("placements.csv:2: needs 1 <= local_bsz <= 1e7");
  // Found by the fuzzer too: a per-GPU batch of 0.5 made the largest batch per GPU 0, and a
  // division by it infinite.
  std::ofstream(root + "/app/placements.csv")
      << "placement,local_bsz,step_time,sync_time\n1,0.5,0.5,0\n";
  expect_load_error("placements.csv:2: needs 1 <= local_bsz");
  std::ofstream(root + "/app/validation-32.csv")
      << "progress,iteration,metric,grad_sqr,grad_var\n1,1,1,0,0\n";
  expect_load_error("validation-32.csv:2: needs progress above the previous epoch's");
  std::ofstream(root + "/app/validation-32.csv")
      << "progress,iteration,metric,grad_sqr,grad_var\n1,1,1,1,1\n";
  std::ofstream(root + "/app/placements.csv")
      << "placement,local_bsz,step_time,sync_time\n1,32,0.5,0\n";
  expect_load_error("max_epochs 3 but its validation files have 1 epoch(s)");
  std::ofstream(root + "/apps.csv") << "name,max_epochs\nother,1\n";
  expect_load_error("application 'other': no directory");
}

const std::string kDtrain = std::string(DTRAIN_BIN_DIR) + "/dtrain";
const std::string kData = std::string(DTRAIN_SOURCE_DIR) + "/data/pollux";

TEST(SchedSimCommand, ComparesPoliciesAndWritesJsonAndSvg) {
  const std::string json = ::testing::TempDir() + "/sched_out.json";
  const std::string svg = ::testing::TempDir() + "/sched_out.svg";
  auto r = testing::run_command({kDtrain, "sched-sim", "--policy", "fifo,tiresias", "--placement",
                                 "pack,spread", "--json", json, "--svg", svg,
                                 kData + "/workloads/workload-6.csv"});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  for (const char* row : {"fifo/pack", "fifo/spread", "tiresias/pack", "tiresias/spread"})
    EXPECT_NE(r.output.find(row), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("workload-6.csv: 160 jobs"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::file_size(json) > 1000);
  EXPECT_TRUE(std::filesystem::file_size(svg) > 1000);
  // The job table itself, rigid jobs of one virtual cluster over 8 hours.
  r = testing::run_command({kDtrain, "sched-sim", "--policy", "all", "--placement", "auto",
                            "--nodes", "64", "--cluster", "6214e9", "--start",
                            "2017-10-09 00:00:00", "--hours", "8", "--min-duration", "60",
                            kData + "/traces/philly.csv"});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  EXPECT_NE(r.output.find("srtf/auto"), std::string::npos) << r.output;
  // A cluster of two GPU models: half the nodes half as fast.
  r = testing::run_command({kDtrain, "sched-sim", "--gpu-models", "v100:8:1.0,p100:8:0.5",
                            kData + "/workloads/workload-6.csv"});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  EXPECT_NE(r.output.find("cluster: 16 nodes x 4 GPUs (v100:8:1.0,p100:8:0.5)"), std::string::npos)
      << r.output;
}

// With no arguments it replays Pollux's baseline; Pollux's workloads are named by their path
// where dtrain keeps them, from any folder (an installed dtrain has no data/pollux here).
TEST(SchedSimCommand, DefaultsToPolluxsBaselineAndFindsPolluxsWorkloadsFromAnywhere) {
  auto r = testing::run_command({"sh", "-c", "cd / && " + kDtrain + " sched-sim"});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  EXPECT_NE(r.output.find("no workload given: replaying Pollux's workload 6"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(" 3470 s "), std::string::npos) << r.output;  // published: 3,469.7 s
  r = testing::run_command(
      {"sh", "-c", "cd / && " + kDtrain + " sched-sim --policy fifo workloads-2.0/workload-3.csv"});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  EXPECT_NE(r.output.find("workload-3.csv: "), std::string::npos) << r.output;
  r = testing::run_command({kDtrain, "sched-sim", "workloads/workload-9.csv"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("workload 'workloads/workload-9.csv' does not exist, here or under"),
            std::string::npos)
      << r.output;
}

TEST(SchedSimCommand, BadChoicesFailWithOneClearLine) {
  auto r = testing::run_command(
      {kDtrain, "sched-sim", "--policy", "lottery", kData + "/workloads/workload-6.csv"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("unknown policy 'lottery': fifo, srtf, tiresias"), std::string::npos)
      << r.output;
  r = testing::run_command(
      {kDtrain, "sched-sim", "--nodes", "2", kData + "/workloads/workload-6.csv"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("asks for"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the cluster has 8"), std::string::npos) << r.output;
  r = testing::run_command(
      {kDtrain, "sched-sim", "--gpu-models", "v100:8", kData + "/workloads/workload-6.csv"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("should read MODEL:NODES:SPEED"), std::string::npos) << r.output;
  r = testing::run_command(
      {kDtrain, "sched-sim", "--traces", "/nonexistent", kData + "/workloads/workload-6.csv"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("give --traces DIR"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dtrain::scheduling
