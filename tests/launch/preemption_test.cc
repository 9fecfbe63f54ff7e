// Preemption that loses nothing: `dtrain run` over preempt_worker, warned by SIGTERM or SIGUSR1
// (the launcher's, as Kubernetes and Slurm send them, or one worker's own), stops every rank after
// the same step, saves it and exits 75; run again, it resumes, and every sample is trained once.
#include "dtrain/preemption.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "launch/launched.h"

namespace dtrain::testing {
namespace {

const std::string kWorker = std::string(DTRAIN_BIN_DIR) + "/preempt_worker";

std::vector<std::string> lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

int exit_code(const std::optional<int>& status) {
  return status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
}

class PreemptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/dtrain_preempt_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::vector<std::string> run_args(int steps) const {
    return {"run",
            "-n",
            "3",
            "--master-port",
            "0",
            "--grace-period",
            "20",
            "--",
            kWorker,
            "--dir",
            dir_,
            "--steps",
            std::to_string(steps),
            "--step-ms",
            "10"};
  }
  // Waits until rank 0 has trained `n` samples in all (every run so far).
  bool trained(Launched& run, size_t n) {
    auto deadline = Deadline::after(seconds(60));
    while (lines(dir_ + "/samples").size() < n) {
      if (deadline.expired()) return false;
      run.pump(milliseconds(5));  // the workers print nothing meanwhile: poll the file
    }
    return true;
  }
  // Every sample 0..steps-1 exactly once.
  void expect_each_sample_once(int steps) {
    std::map<std::string, int> count;
    for (const auto& l : lines(dir_ + "/samples")) ++count[l];
    EXPECT_EQ(count.size(), static_cast<size_t>(steps));
    for (int s = 0; s < steps; ++s)
      EXPECT_EQ(count["sample " + std::to_string(s)], 1) << "sample " << s;
  }
  std::string dir_;
};

TEST_F(PreemptionTest, SignalledLauncherStopsEveryRankAtOneStepAndTheRequeuedJobResumes) {
  const int steps = 200;
  {
    Launched run(run_args(steps));
    ASSERT_TRUE(trained(run, 10)) << run.err();
    ::kill(run.pid(), SIGTERM);  // Kubernetes' warning: the launcher passes it on
    const int code = exit_code(run.wait(seconds(60)));
    EXPECT_EQ(code, Preemption::kRequeueExitCode) << run.err();
    EXPECT_NE(run.err().find("dtrain run: preempted (SIGTERM): every worker saved its state and "
                             "exited 75; run the job again (requeue) to resume"),
              std::string::npos)
        << run.err();
    EXPECT_NE(run.out().find("preempted after step"), std::string::npos) << run.out();
    // The checkpoint is exactly where the samples stop: nothing trained after it is lost.
    std::ifstream ckpt(dir_ + "/ckpt");
    size_t saved = 0;
    ckpt >> saved;
    EXPECT_EQ(saved, lines(dir_ + "/samples").size());
  }
  {
    Launched run(run_args(steps));  // requeued: Slurm's warning this time
    ASSERT_TRUE(trained(run, lines(dir_ + "/samples").size() + 10)) << run.err();
    ::kill(run.pid(), SIGUSR1);  // a warning: passed on, no SIGKILL after it
    EXPECT_EQ(exit_code(run.wait(seconds(60))), Preemption::kRequeueExitCode) << run.err();
    EXPECT_NE(run.err().find("dtrain run: preempted (SIGUSR1): every worker saved"),
              std::string::npos)
        << run.err();
    EXPECT_NE(run.out().find("resumed from step"), std::string::npos) << run.out();
  }
  Launched run(run_args(steps));
  EXPECT_EQ(exit_code(run.wait(seconds(60))), 0) << run.err();
  EXPECT_NE(run.out().find("DONE step 200"), std::string::npos) << run.out();
  expect_each_sample_once(steps);
}

TEST_F(PreemptionTest, AWarningToOneRankStopsThemAllAtTheSameStep) {
  const int steps = 200;
  Launched run(run_args(steps));
  ASSERT_TRUE(trained(run, 10)) << run.err();
  // Only rank 2 is told (a signal sent to one process): the all-reduce stops the others too.
  pid_t rank2 = 0;
  for (const auto& l : lines(dir_ + "/pids")) {
    std::istringstream in(l);
    std::string word;
    int rank = -1;
    pid_t pid = 0;
    in >> word >> rank >> word >> pid;
    if (rank == 2) rank2 = pid;
  }
  ASSERT_GT(rank2, 0);
  ::kill(rank2, SIGUSR1);
  EXPECT_EQ(exit_code(run.wait(seconds(60))), Preemption::kRequeueExitCode) << run.err();
  EXPECT_NE(run.err().find("dtrain run: preempted: every worker saved its state and exited 75"),
            std::string::npos)
      << run.err();
  Launched again(run_args(steps));
  EXPECT_EQ(exit_code(again.wait(seconds(60))), 0) << again.err();
  expect_each_sample_once(steps);
}

}  // namespace
}  // namespace dtrain::testing
