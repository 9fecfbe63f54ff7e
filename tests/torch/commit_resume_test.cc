// End to end (issue #7): one of three train_fashion_mnist workers under elastic `dtrain run` is
// killed with SIGKILL in the middle of an epoch. The job restarts from the in-memory commit its
// agent kept in /dev/shm and finishes; every sample of every epoch is trained exactly once (the
// sample log keeps, per step, the lines of the latest restart that trained it: the steps after
// the commit are trained again, and that later run's state is the one training went on from),
// at most one step is lost, and the final parameters (--save, --deterministic, same world size)
// are byte-identical to those of a run that was never interrupted.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "launch/launched.h"

namespace dtrain {
namespace {

using namespace dtrain::testing;
namespace fs = std::filesystem;

const std::string kTrainer = std::string(DTRAIN_BIN_DIR) + "/train_fashion_mnist";
constexpr int kRanks = 3;
constexpr int64_t kSamples = 1800;
constexpr int64_t kBatch = 20;
constexpr int64_t kEpochs = 2;
constexpr int64_t kStepsPerEpoch = kSamples / kRanks / kBatch;  // 30
constexpr int64_t kKillAfterStep = 40;                          // a third into the second epoch

bool have_dataset() {
  return fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct Sample {
  int64_t epoch = 0, index = 0, step = 0, restart = 0;
};

std::vector<Sample> read_samples(const fs::path& log) {
  std::vector<Sample> all;
  std::istringstream in(read_file(log));
  Sample s;
  while (in >> s.epoch >> s.index >> s.step >> s.restart) all.push_back(s);
  return all;
}

// The committed work: for each step, the lines of the latest restart that logged it.
std::vector<Sample> committed(const std::vector<Sample>& all) {
  std::map<int64_t, int64_t> latest;
  for (const auto& s : all) latest[s.step] = std::max(latest[s.step], s.restart);
  std::vector<Sample> kept;
  for (const auto& s : all)
    if (s.restart == latest[s.step]) kept.push_back(s);
  return kept;
}

std::vector<std::string> job_args(const fs::path& dir, const std::string& name) {
  return {"run", "-n", std::to_string(kRanks), "--max-restarts", "2", "--rdzv-id",
          "commit-test-" + std::to_string(::getpid()), "--", kTrainer, "--threads", "1",
          "--deterministic", "--train-samples", std::to_string(kSamples), "--batch-size",
          std::to_string(kBatch), "--epochs", std::to_string(kEpochs), "--sample-log",
          (dir / (name + ".log")).string(), "--save", (dir / (name + ".safetensors")).string()};
}

// The worker of `rank` in restart 0: a child of the agent with RANK=<rank> in its environment.
pid_t find_worker(pid_t agent, int rank) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string stat = read_file(e.path() / "stat");
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    fields >> state >> ppid;
    if (ppid != agent) continue;
    std::string env = read_file(e.path() / "environ");
    std::istringstream vars(env);
    bool is_rank = false, first_round = false;
    for (std::string var; std::getline(vars, var, '\0');) {
      is_rank = is_rank || var == "RANK=" + std::to_string(rank);
      first_round = first_round || var == "DTRAIN_RESTART_COUNT=0";
    }
    if (is_rank && first_round) return static_cast<pid_t>(std::stol(name));
  }
  return -1;
}

std::string dump(const Launched& a) { return "stdout:\n" + a.out() + "\nstderr:\n" + a.err(); }

class CommitResume : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string pattern = (fs::temp_directory_path() / "dtrain_commit_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // The parameters of the run that is never interrupted, computed once.
  static const std::string& reference() {
    static std::string bytes = [] {
      Launched run(job_args(dir_, "whole"));
      EXPECT_EQ(exit_code(run.wait(seconds(120))), 0) << dump(run);
      return read_file(dir_ / "whole.safetensors");
    }();
    return bytes;
  }

  // Kills the worker of `victim_rank` mid-epoch and checks everything the issue asks for.
  void kill_and_check(int victim_rank) {
    if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
    const std::string& whole = reference();
    ASSERT_FALSE(whole.empty());

    const std::string name = "killed" + std::to_string(victim_rank);
    const fs::path log = dir_ / (name + ".log");
    Launched run(job_args(dir_, name));
    auto deadline = Deadline::after(seconds(90));
    bool reached = false;
    while (!reached && !deadline.expired()) {
      run.pump(milliseconds(20));
      for (const auto& s : read_samples(log)) reached = reached || s.step >= kKillAfterStep;
    }
    ASSERT_TRUE(reached) << "step " << kKillAfterStep << " not reached\n" << dump(run);
    const pid_t victim = find_worker(run.pid(), victim_rank);
    ASSERT_GT(victim, 0) << "no worker with RANK=" << victim_rank << " under pid " << run.pid();
    ASSERT_EQ(::kill(victim, SIGKILL), 0);

    ASSERT_EQ(exit_code(run.wait(seconds(120))), 0) << dump(run);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(
        run.err(), m,
        std::regex("round 0 stopped after [0-9.]+ s: rank " + std::to_string(victim_rank) +
                   " \\(pid " + std::to_string(victim) + "\\) .*killed by SIGKILL.*restart 1 of 2")))
        << dump(run);
    // The relayed resume line: an in-memory commit in the agent's /dev/shm directory.
    ASSERT_TRUE(std::regex_search(
        run.err(), m,
        std::regex("round 1: rank 0 resumed from (/dev/shm/dtrain-commit-[^ ]+)/step-0*([0-9]+) "
                   "\\(epoch ([0-9]+), step [0-9]+, [0-9]+ of 1800 samples of the epoch done, "
                   "saved at world size 3\\): in-memory commit, loaded by rank ([0-9]+); the steps "
                   "after [0-9]+ are trained again \\(at most 1\\), training again ([0-9.]+) s "
                   "after round 0 stopped")))
        << dump(run);
    const std::string commit_dir = m[1];
    const int64_t restored = std::stoll(m[2]);
    std::cout << "killed rank " << victim_rank << " after step " << kKillAfterStep
              << "; resumed from the commit of step " << restored << ", training again " << m[5]
              << " s after round 0 stopped\n";
    EXPECT_FALSE(fs::exists(commit_dir)) << "the agent removes its commit directory when it exits";

    // Work lost: the steps round 0 finished beyond the commit it resumed from.
    const auto all = read_samples(log);
    int64_t reached_before = 0, first_after = -1;
    for (const auto& s : all) {
      if (s.restart == 0) reached_before = std::max(reached_before, s.step);
      if (s.restart == 1 && (first_after < 0 || s.step < first_after)) first_after = s.step;
    }
    EXPECT_GE(reached_before, kKillAfterStep);
    // A step is logged as it starts. A rank that logged step k has finished k-1, and so has
    // every rank (k-1's all-reduce joined them all); the writer may still be committing k-1
    // (it waits for that only before its own gradients of k go out), so the commit of k-2 is
    // the oldest a restart may use: at most one finished step is trained again.
    EXPECT_GE(restored, reached_before - 2) << "more than one finished step lost";
    EXPECT_LE(restored, reached_before);
    EXPECT_EQ(first_after, restored + 1);
    std::cout << "round 0 reached step " << reached_before << ": " << reached_before - restored
              << " step(s) trained again\n";

    // Every sample of every epoch exactly once, counting the committed work.
    std::map<std::pair<int64_t, int64_t>, int> count;
    std::set<int64_t> steps;
    for (const auto& s : committed(all)) {
      ++count[{s.epoch, s.index}];
      steps.insert(s.step);
    }
    EXPECT_EQ(count.size(), static_cast<size_t>(kSamples * kEpochs));
    for (const auto& [at, c] : count)
      EXPECT_EQ(c, 1) << "epoch " << at.first << " sample " << at.second << " trained " << c
                      << " times";
    EXPECT_EQ(steps.size(), static_cast<size_t>(kStepsPerEpoch * kEpochs));
    EXPECT_EQ(*steps.begin(), 1);
    EXPECT_EQ(*steps.rbegin(), kStepsPerEpoch * kEpochs);

    const std::string resumed = read_file(dir_ / (name + ".safetensors"));
    EXPECT_TRUE(resumed == whole)
        << "the parameters after the restart differ from the uninterrupted run's";
  }

  static fs::path dir_;
};

fs::path CommitResume::dir_;

TEST_F(CommitResume, KilledWorkerResumesFromInMemoryCommitEverySampleOnceBitIdentical) {
  kill_and_check(1);
}

// The commit writer itself dies: its commits are in the agent's memory, not in the process.
TEST_F(CommitResume, KilledCommitWriterResumesFromItsCommit) { kill_and_check(0); }

}  // namespace
}  // namespace dtrain
