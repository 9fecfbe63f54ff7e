// The elastic agent (`dtrain run --max-restarts`, `--nnodes MIN:MAX`), tested through the real
// binary with real workers (elastic_worker.cc: a process group that all-reduces every step and
// checkpoints its step): a worker killed with SIGKILL, failures beyond --max-restarts, a machine
// (agent) lost and another one joining, a machine whose workers keep failing. Two agents on one
// machine play two machines: each is a `dtrain run` of its own with its own --node-name.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "launch/launched.h"
#include "support/multiproc.h"

namespace dtrain {
namespace {

using namespace dtrain::testing;

const std::string kWorker = std::string(DTRAIN_BIN_DIR) + "/elastic_worker";

struct Progress {
  int restart = 0;
  int world = 0;
  int step = 0;
};

struct WorkerPid {
  int restart = 0;
  int rank = 0;
  pid_t pid = -1;
};

class ElasticTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "dtrain_elastic_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::vector<std::string> worker(std::vector<std::string> extra) const {
    std::vector<std::string> args{"--", kWorker, "--dir", dir_.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  // Rank 0's "restart R world W step S" lines.
  std::vector<Progress> progress() const {
    std::vector<Progress> lines;
    std::ifstream in(dir_ / "progress");
    std::string word;
    Progress p;
    while (in >> word >> p.restart >> word >> p.world >> word >> p.step) lines.push_back(p);
    return lines;
  }

  std::vector<WorkerPid> pids() const {
    std::vector<WorkerPid> all;
    std::ifstream in(dir_ / "pids");
    std::string word;
    WorkerPid w;
    while (in >> word >> w.restart >> word >> w.rank >> word >> w.pid) all.push_back(w);
    return all;
  }

  void expect_no_worker_left() const {
    for (const auto& w : pids())
      EXPECT_TRUE(gone_soon(w.pid)) << "rank " << w.rank << " of restart " << w.restart << " (pid "
                                    << w.pid << ") outlived its agent";
  }

  std::filesystem::path dir_;
};

std::string dump(const Launched& a) { return "stdout:\n" + a.out() + "\nstderr:\n" + a.err(); }

TEST_F(ElasticTest, KilledWorkerRestartsFromItsCheckpointAndTheJobFinishes) {
  auto args = std::vector<std::string>{"run", "-n", "3", "--max-restarts", "2"};
  for (auto& a : worker({"--steps", "60", "--step-ms", "30"})) args.push_back(a);
  Launched run(args);
  ASSERT_TRUE(wait_for(
      [&] {
        auto p = progress();
        return !p.empty() && p.back().step >= 10;
      },
      {&run}, seconds(60)))
      << dump(run);
  pid_t victim = -1;
  for (const auto& w : pids())
    if (w.restart == 0 && w.rank == 1) victim = w.pid;
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);

  EXPECT_EQ(exit_code(run.wait(seconds(90))), 0) << dump(run);
  // The restart, with its cause, in one line; then where the workers resumed.
  std::smatch m;
  EXPECT_TRUE(std::regex_search(
      run.err(), m,
      std::regex("round 0 stopped after [0-9.]+ s: rank 1 \\(pid " + std::to_string(victim) +
                 "\\) on node .* was killed by SIGKILL.*restart 1 of 2")))
      << dump(run);
  EXPECT_TRUE(std::regex_search(
      run.err(), m,
      std::regex("round 1: rank 0 resumed from step ([0-9]+).*training again ([0-9.]+) s after")))
      << dump(run);
  // Every step counted once: the total carried through the checkpoint equals the step.
  EXPECT_TRUE(contains(run.out(), "DONE step 60 total 60 world 3")) << dump(run);
  auto p = progress();
  ASSERT_FALSE(p.empty());
  EXPECT_EQ(p.back().restart, 1);
  EXPECT_EQ(p.back().step, 60);
  expect_no_worker_left();
}

TEST_F(ElasticTest, FailuresBeyondMaxRestartsEndTheJobWithASummary) {
  auto args = std::vector<std::string>{"run", "-n", "2", "--max-restarts", "2"};
  for (auto& a :
       worker({"--steps", "1000", "--step-ms", "5", "--fail-node-rank", "0", "--fail-after", "3"}))
    args.push_back(a);
  Launched run(args);
  // Rank 0 fails on purpose and rank 1 fails a moment later on the broken collective; which of
  // the two exits the launcher reaps first is a race, so either may be named (exit code 3 or 1).
  const int code = exit_code(run.wait(seconds(90)));
  EXPECT_TRUE(code == 3 || code == 1) << code << dump(run);
  const std::string& err = run.err();
  EXPECT_TRUE(contains(err, "restart 1 of 2")) << dump(run);
  EXPECT_TRUE(contains(err, "restart 2 of 2")) << dump(run);
  EXPECT_TRUE(contains(err, "failure 3, more than --max-restarts 2: the job ends")) << dump(run);
  // The summary names every round and its cause. When rank 0 is slow to exit (it is, under
  // AddressSanitizer), rank 1's post-mortem may name it as silent while it is still running: it
  // is then named as one that did not answer, never with the exit code it has not had yet.
  auto summary = err.substr(err.find("job 'dtrain' failed"));
  for (int r = 0; r < 3; ++r) {
    std::regex line("round " + std::to_string(r) +
                    ": 1 node\\(s\\).*2 worker\\(s\\).*(rank 0 \\(pid [0-9]+\\) on node .* failed "
                    "with exit code 3; last stderr: \"elastic_worker: rank 0 failing on purpose|"
                    "rank 0 \\(pid [0-9]+\\) on node .* did not answer its peers \\(stopped or "
                    "stuck: still running when rank 1 failed naming it\\); last stderr: "
                    "\"elastic_worker: rank 0 failing on purpose|"
                    "rank 1 \\(pid [0-9]+\\) on node .* failed with exit code 1; last stderr: "
                    "\".*rank 0 \\([0-9.:]+\\) closed its process group)");
    EXPECT_TRUE(std::regex_search(summary, line)) << "round " << r << "\n" << summary;
  }
  EXPECT_EQ(pids().size(), 6u) << dump(run);  // two workers in each of three rounds
  expect_no_worker_left();
}

// One agent lost with its workers: the job goes on with the other; a new agent joins at the next
// restart, and the world grows back.
TEST_F(ElasticTest, AgentsLeaveAndJoinWhileTheJobRuns) {
  const std::string stop = (dir_ / "stop").string();
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto agent = [&](const std::string& node) {
    std::vector<std::string> args{"run",
                                  "-n",
                                  "2",
                                  "--nnodes",
                                  "1:2",
                                  "--max-restarts",
                                  "5",
                                  "--rdzv-endpoint",
                                  endpoint,
                                  "--rdzv-id",
                                  "elastic-test-" + std::to_string(::getpid()),
                                  "--rdzv-last-call",
                                  "1",
                                  "--heartbeat-timeout",
                                  "3",
                                  "--node-name",
                                  node};
    for (auto& a : worker({"--steps", "100000", "--step-ms", "20", "--stop-file", stop}))
      args.push_back(a);
    return args;
  };
  Launched a(agent("a"));
  ASSERT_TRUE(
      wait_for([&] { return contains(a.err(), "hosts the rendezvous store"); }, {&a}, seconds(30)))
      << dump(a);
  auto b = std::make_unique<Launched>(agent("b"));
  auto world_now = [&](int world) {
    auto p = progress();
    return !p.empty() && p.back().world == world;
  };
  ASSERT_TRUE(wait_for([&] { return world_now(4); }, {&a, b.get()}, seconds(60)))
      << dump(a) << "\n--- b:\n"
      << dump(*b);

  // Machine b goes away: its agent and (through PR_SET_PDEATHSIG) its workers.
  ::kill(b->pid(), SIGKILL);
  EXPECT_NE(exit_code(b->wait(seconds(10))), 0);
  ASSERT_TRUE(wait_for([&] { return world_now(2); }, {&a}, seconds(60))) << dump(a);

  Launched c(agent("c"));
  ASSERT_TRUE(wait_for([&] { return world_now(4); }, {&a, &c}, seconds(60)))
      << dump(a) << "\n--- c:\n"
      << dump(c);
  EXPECT_TRUE(contains(a.err(), "node c")) << dump(a);
  EXPECT_TRUE(contains(a.err(), "is waiting to join")) << dump(a);
  EXPECT_TRUE(contains(a.err(), "not counted against --max-restarts")) << dump(a);

  std::ofstream(stop).put('x');
  EXPECT_EQ(exit_code(a.wait(seconds(60))), 0) << dump(a);
  EXPECT_EQ(exit_code(c.wait(seconds(60))), 0) << dump(c);
  auto p = progress();
  ASSERT_FALSE(p.empty());
  EXPECT_TRUE(contains(a.out(), "DONE step " + std::to_string(p.back().step) + " total " +
                                    std::to_string(p.back().step) + " world 4"))
      << dump(a);
  expect_no_worker_left();
}

// The agent that hosts the rendezvous store (and its machine) is lost: the other agent stops its
// workers and the job at once, saying what it lost, and what was committed is not: a new job
// resumes from the last checkpoint and counts every step exactly once.
TEST_F(ElasticTest, LosingTheStoresHostStopsTheOthersClearlyAndTheCommittedStepResumes) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto agent = [&](const std::string& node, const std::string& nnodes, int steps) {
    std::vector<std::string> args{"run",
                                  "-n",
                                  "2",
                                  "--nnodes",
                                  nnodes,
                                  "--max-restarts",
                                  "5",
                                  "--rdzv-endpoint",
                                  endpoint,
                                  "--rdzv-id",
                                  "store-host-test-" + std::to_string(::getpid()),
                                  "--rdzv-last-call",
                                  "1",
                                  "--node-name",
                                  node};
    for (auto& a : worker({"--steps", std::to_string(steps), "--step-ms", "20"})) args.push_back(a);
    return args;
  };
  auto a = std::make_unique<Launched>(agent("a", "2:2", 100000));
  ASSERT_TRUE(wait_for([&] { return contains(a->err(), "hosts the rendezvous store"); }, {a.get()},
                       seconds(30)))
      << dump(*a);
  Launched b(agent("b", "2:2", 100000));
  ASSERT_TRUE(wait_for(
      [&] {
        auto p = progress();
        return !p.empty() && p.back().world == 4 && p.back().step >= 10;
      },
      {a.get(), &b}, seconds(60)))
      << dump(*a) << "\n--- b:\n"
      << dump(b);

  ::kill(a->pid(), SIGKILL);  // the store's machine goes, its workers with it
  EXPECT_NE(exit_code(a->wait(seconds(10))), 0);
  const auto lost = std::chrono::steady_clock::now();
  EXPECT_NE(exit_code(b.wait(seconds(30))), 0) << dump(b);
  EXPECT_LT(std::chrono::steady_clock::now() - lost, seconds(20)) << dump(b);
  EXPECT_TRUE(contains(b.err(), "lost the rendezvous store at " + endpoint)) << dump(b);
  EXPECT_TRUE(contains(b.err(), "the job cannot go on without it")) << dump(b);
  expect_no_worker_left();

  // Started again (one machine now), the job goes on from the step its checkpoint holds.
  int committed = 0, total = 0;
  std::ifstream(dir_ / "ckpt") >> committed >> total;
  ASSERT_GE(committed, 10);
  EXPECT_EQ(total, committed);
  const int steps = committed + 20;
  Launched again(agent("a", "1:1", steps));
  EXPECT_EQ(exit_code(again.wait(seconds(90))), 0) << dump(again);
  EXPECT_TRUE(contains(again.out(), "resumed from step " + std::to_string(committed)))
      << dump(again);
  EXPECT_TRUE(contains(again.out(), "DONE step " + std::to_string(steps) + " total " +
                                        std::to_string(steps) + " world 2"))
      << dump(again);
}

// Node b's workers fail in every round it is in: after --exclude-after failures it sits out, and
// the job finishes on node a alone.
TEST_F(ElasticTest, NodeWhoseWorkersKeepFailingIsExcluded) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto agent = [&](const std::string& node) {
    std::vector<std::string> args{"run",
                                  "-n",
                                  "1",
                                  "--nnodes",
                                  "1:2",
                                  "--max-restarts",
                                  "6",
                                  "--rdzv-endpoint",
                                  endpoint,
                                  "--rdzv-id",
                                  "exclude-test-" + std::to_string(::getpid()),
                                  "--rdzv-last-call",
                                  "1",
                                  "--exclude-after",
                                  "2",
                                  "--exclude-for",
                                  "120",
                                  "--node-name",
                                  node};
    // Node rank 1 (b, the younger agent, while both run) fails after 3 steps of each round.
    for (auto& a : worker(
             {"--steps", "150", "--step-ms", "20", "--fail-node-rank", "1", "--fail-after", "3"}))
      args.push_back(a);
    return args;
  };
  Launched a(agent("a"));
  ASSERT_TRUE(
      wait_for([&] { return contains(a.err(), "hosts the rendezvous store"); }, {&a}, seconds(30)))
      << dump(a);
  Launched b(agent("b"));
  EXPECT_EQ(exit_code(a.wait(seconds(120))), 0) << dump(a) << "\n--- b:\n" << dump(b);
  EXPECT_EQ(exit_code(b.wait(seconds(30))), 0) << dump(b);
  EXPECT_TRUE(contains(b.err(), "excluding this node")) << dump(b);
  EXPECT_TRUE(contains(b.err(), "finished while this node was excluded")) << dump(b);
  EXPECT_TRUE(contains(a.out(), "DONE step 150 total 150 world 1")) << dump(a);
  expect_no_worker_left();
}

// Network namespaces as two machines (NamespaceHosts): each agent has its own address, the
// workers reach node 0's store and each other over TCP. A worker of host 1 is killed; the job
// restarts on both hosts and finishes.
TEST_F(ElasticTest, TwoHostsInNetworkNamespacesRestartTogether) {
  NamespaceHosts hosts("de", 2);
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  auto agent = [&](const std::string& node) {
    std::vector<std::string> args{"run",
                                  "-n",
                                  "2",
                                  "--nnodes",
                                  "2",
                                  "--max-restarts",
                                  "1",
                                  "--rdzv-endpoint",
                                  hosts.addr(0) + ":29400",
                                  "--rdzv-id",
                                  hosts.name,
                                  "--node-name",
                                  node};
    for (auto& a : worker({"--steps", "60", "--step-ms", "30"})) args.push_back(a);
    return args;
  };
  Launched h0(agent("h0"), hosts.on(0));
  ASSERT_TRUE(wait_for([&] { return contains(h0.err(), "hosts the rendezvous store"); }, {&h0},
                       seconds(30)))
      << dump(h0);
  Launched h1(agent("h1"), hosts.on(1));
  ASSERT_TRUE(wait_for(
      [&] {
        auto p = progress();
        return !p.empty() && p.back().step >= 10;
      },
      {&h0, &h1}, seconds(60)))
      << dump(h0) << "\n--- h1:\n"
      << dump(h1);
  pid_t victim = -1;
  for (const auto& w : pids())
    if (w.restart == 0 && w.rank == 3) victim = w.pid;
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  EXPECT_EQ(exit_code(h0.wait(seconds(90))), 0) << dump(h0) << "\n--- h1:\n" << dump(h1);
  EXPECT_EQ(exit_code(h1.wait(seconds(30))), 0) << dump(h1);
  // Both agents print the same cause, naming host 1 by its address, and meet again.
  const std::string cause = "round 0 stopped after";
  const std::string who =
      "rank 3 (pid " + std::to_string(victim) + ") on node h1 (" + hosts.addr(1) + ", agent 2";
  for (const Launched* a : {&h0, &h1}) {
    EXPECT_TRUE(contains(a->err(), cause) && contains(a->err(), who)) << dump(*a);
    EXPECT_TRUE(contains(a->err(), "round 1: 2 node(s) (h0, h1)")) << dump(*a);
  }
  EXPECT_TRUE(contains(h0.out(), "DONE step 60 total 60 world 4")) << dump(h0);
  expect_no_worker_left();
}

TEST_F(ElasticTest, BadElasticArgumentsAreRejected) {
  for (std::vector<std::string> args :
       {std::vector<std::string>{"run", "--nnodes", "2:1", "--max-restarts", "1", "true"},
        {"run", "--nnodes", "1:x", "true"},
        {"run", "--nnodes", "1:2", "--node-rank", "1", "--rdzv-endpoint", "127.0.0.1:1", "true"},
        {"run", "--max-restarts", "-1", "true"},
        {"run", "--max-restarts", "1", "--rdzv-endpoint", "no-port-here", "true"},
        // Several machines with no rendezvous endpoint: each would form a job of its own.
        {"run", "--nnodes", "1:2", "--max-restarts", "1", "true"}}) {
    Launched run(args);
    EXPECT_NE(exit_code(run.wait(seconds(20))), 0) << args[2];
    EXPECT_FALSE(run.err().empty()) << args[2];
  }
  Launched no_endpoint({"run", "--nnodes", "1:2", "--max-restarts", "1", "true"});
  no_endpoint.wait(seconds(20));
  EXPECT_NE(no_endpoint.err().find("--rdzv-endpoint"), std::string::npos) << no_endpoint.err();
}

}  // namespace
}  // namespace dtrain
