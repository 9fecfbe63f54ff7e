// `dtrain run`, tested through the real binary: the environment each rank sees, output prefixing,
// a failing rank stopping the job, signals reaching the workers, and the grace period's SIGKILL.
// Every launch has its own deadline; when it passes the launcher is killed and the test fails.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "common/jemalloc_conf.h"
#include "common/socket.h"
#include "launch/cpu_binding.h"
#include "launch/launched.h"
#include "support/multiproc.h"

namespace dtrain {
namespace {

using namespace dtrain::testing;

class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "dtrain_launcher_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
};

TEST_F(LauncherTest, GoodJobExitsZero) {
  Launched run({"run", "-n", "2", "--master-port", "0", "/bin/true"});
  EXPECT_EQ(exit_code(run.wait(seconds(20))), 0) << run.err();
}

TEST_F(LauncherTest, EachRankSeesItsEnvironment) {
  Launched run({"run", "-n", "3", "--master-port", "0", "--", "sh", "-c",
                "echo env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $NODE_RANK $MASTER_ADDR "
                "$MASTER_PORT $DTRAIN_AGENT_STORE"});
  ASSERT_EQ(exit_code(run.wait(seconds(20))), 0) << run.err();
  std::istringstream lines(run.out());
  std::string line;
  std::vector<bool> seen(3, false);
  std::string port;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string prefix_rank, prefix_num, tag, master_addr, master_port;
    int rank, world, local, local_world, node, agent;
    words >> prefix_rank >> prefix_num >> tag >> rank >> world >> local >> local_world >> node >>
        master_addr >> master_port >> agent;
    ASSERT_FALSE(words.fail()) << line;
    ASSERT_GE(rank, 0);
    ASSERT_LT(rank, 3);
    EXPECT_EQ(prefix_num, std::to_string(rank) + "]");
    EXPECT_EQ(world, 3);
    EXPECT_EQ(local, rank);
    EXPECT_EQ(local_world, 3);
    EXPECT_EQ(node, 0);
    EXPECT_EQ(master_addr, "127.0.0.1");
    EXPECT_NE(master_port, "0");  // --master-port 0 became a real port
    if (!port.empty()) {
      EXPECT_EQ(master_port, port);
    }
    port = master_port;
    EXPECT_EQ(agent, 1);
    seen[rank] = true;
  }
  EXPECT_EQ(seen, std::vector<bool>(3, true)) << run.out();
}

// Shares are equal and contiguous, cover every CPU once, and vanish when processes outnumber
// CPUs (the scheduler places those).
TEST(CpuShare, EqualContiguousSharesOrNone) {
  const std::vector<int> cpus = {0, 1, 2, 3, 4, 5, 8, 9, 10, 11};
  for (int count = 1; count <= 10; ++count) {
    std::vector<int> all;
    for (int i = 0; i < count; ++i) {
      auto share = launch::cpu_share(i, count, cpus);
      const size_t want = cpus.size() / count + (static_cast<size_t>(i) < cpus.size() % count);
      EXPECT_EQ(share.size(), want) << i << " of " << count;
      all.insert(all.end(), share.begin(), share.end());
    }
    EXPECT_EQ(all, cpus) << count;
  }
  EXPECT_TRUE(launch::cpu_share(0, 11, cpus).empty());
  EXPECT_EQ(launch::describe_cpus({0, 1, 2, 3, 6, 8, 9}), "0-3,6,8-9");
}

// `dtrain run` gives each worker its share of the CPUs it may use itself (--bind auto, the
// default, as mpirun binds to cores), and none with --bind none or more workers than CPUs.
// jemalloc for the workers (launch/allocator_preload.h): preloaded with dtrain's settings unless
// opted out; a MALLOC_CONF, or an allocator in LD_PRELOAD, that the user set is kept.
TEST_F(LauncherTest, WorkersGetJemallocUnlessTheyChooseOtherwise) {
  auto show = [](std::vector<std::string> flags, std::vector<std::string> env) {
    std::vector<std::string> args = {"run", "--master-port", "0", "--no-prefix"};
    args.insert(args.end(), flags.begin(), flags.end());
    for (const char* a : {"--", "sh", "-c", "echo \"alloc [$LD_PRELOAD] [$MALLOC_CONF]\""})
      args.push_back(a);
    env.insert(env.begin(), "/usr/bin/env");
    auto run = std::make_unique<Launched>(args, env);
    EXPECT_EQ(exit_code(run->wait(seconds(20))), 0) << run->err();
    return run;
  };
  auto plain = show({}, {"-u", "LD_PRELOAD", "-u", "MALLOC_CONF"});
  if (plain->err().find("jemalloc preloaded") == std::string::npos)
    GTEST_SKIP() << "this build preloads no jemalloc (none found, or sanitizers): " << plain->err();
  EXPECT_NE(plain->out().find("libjemalloc.so"), std::string::npos) << plain->out();
  EXPECT_NE(plain->out().find(std::string("] [") + kJemallocConf + "]"), std::string::npos)
      << plain->out();

  auto off = show({"--no-jemalloc"}, {"-u", "LD_PRELOAD", "-u", "MALLOC_CONF"});
  EXPECT_NE(off->out().find("alloc [] []"), std::string::npos) << off->out();
  EXPECT_EQ(off->err().find("jemalloc"), std::string::npos) << off->err();

  auto conf = show({}, {"-u", "LD_PRELOAD", "MALLOC_CONF=narenas:2"});
  EXPECT_NE(conf->out().find("libjemalloc.so"), std::string::npos) << conf->out();
  EXPECT_NE(conf->out().find("] [narenas:2]"), std::string::npos) << conf->out();

  const std::string tcmalloc = (dir_ / "libtcmalloc.so").string();  // named, never loaded
  auto other = show({}, {"-u", "MALLOC_CONF", "LD_PRELOAD=" + tcmalloc});
  EXPECT_NE(other->out().find("alloc [" + tcmalloc + "] []"), std::string::npos) << other->out();
  EXPECT_NE(other->err().find("LD_PRELOAD names tcmalloc already"), std::string::npos)
      << other->err();
}

TEST_F(LauncherTest, WorkersAreBoundToTheirShareOfTheCpus) {
  const std::vector<int> cpus = launch::allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  const std::string all = launch::describe_cpus(cpus);
  auto allowed = [&](const std::vector<std::string>& flags, int n) {
    std::vector<std::string> args = {"run", "-n", std::to_string(n), "--master-port", "0"};
    args.insert(args.end(), flags.begin(), flags.end());
    for (std::string a : {"--", "sh", "-c", "echo $RANK $(grep Cpus_allowed_list /proc/self/status | cut -f2)"})
      args.push_back(a);
    Launched run(args);
    EXPECT_EQ(exit_code(run.wait(seconds(20))), 0) << run.err();
    std::vector<std::string> got(n);
    std::istringstream lines(run.out());
    std::string line, prefix, num, list;
    int rank;
    while (std::getline(lines, line)) {
      std::istringstream words(line);
      words >> prefix >> num >> rank >> list;
      if (!words.fail() && rank >= 0 && rank < n) got[rank] = list;
    }
    return got;
  };
  const int n = std::min<int>(2, static_cast<int>(cpus.size()));
  auto bound = allowed({}, n);
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(bound[r], launch::describe_cpus(launch::cpu_share(r, n, cpus))) << "rank " << r;
  for (const auto& list : allowed({"--bind", "none"}, n)) EXPECT_EQ(list, all);
  const int over = static_cast<int>(cpus.size()) + 1;
  if (over <= 8) {
    for (const auto& list : allowed({}, over)) EXPECT_EQ(list, all);
  }
}

TEST_F(LauncherTest, SecondNodeGetsGlobalRanksAndHostsNoStore) {
  // Node 1 of 2 must not open the store: the port given stays whatever it is.
  int port = testing::free_port();
  Launched run({"run", "-n", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.9.8.7",
                "--master-port", std::to_string(port), "--no-prefix", "sh", "-c",
                "echo $RANK $WORLD_SIZE $LOCAL_RANK $NODE_RANK $MASTER_ADDR $MASTER_PORT"});
  ASSERT_EQ(exit_code(run.wait(seconds(20))), 0) << run.err();
  auto p = std::to_string(port);
  EXPECT_TRUE(contains(run.out(), "2 4 0 1 10.9.8.7 " + p + "\n")) << run.out();
  EXPECT_TRUE(contains(run.out(), "3 4 1 1 10.9.8.7 " + p + "\n")) << run.out();
}

TEST_F(LauncherTest, TheStoreIsReachableWhileTheJobRuns) {
  auto flag = (dir_ / "done").string();
  Launched run({"run", "-n", "1", "--master-port", "0", "sh", "-c",
                "echo port $MASTER_PORT; while [ ! -e " + flag + " ]; do sleep 0.02; done"});
  ASSERT_TRUE(
      run.read_until([&] { return contains(run.out(), "\n"); }, Deadline::after(seconds(20))))
      << run.err();
  auto words = run.out().substr(run.out().find("port ") + 5);
  int port = std::stoi(words);
  net::Fd conn = net::connect_tcp({"127.0.0.1", static_cast<uint16_t>(port)},
                                  Deadline::after(seconds(10)), "launcher test to the store");
  EXPECT_TRUE(conn.valid());
  std::ofstream(flag).put('x');
  EXPECT_EQ(exit_code(run.wait(seconds(20))), 0) << run.err();
}

TEST_F(LauncherTest, DefaultPortBusyMovesToAFreeOne) {
  // Hold 29500 ourselves; if someone else already holds it, it is busy all the same.
  net::Fd holder;
  try {
    holder = net::listen_tcp("127.0.0.1", 29500);
  } catch (const std::exception&) {
  }
  Launched run({"run", "-n", "1", "--no-prefix", "sh", "-c", "echo $MASTER_PORT"});
  ASSERT_EQ(exit_code(run.wait(seconds(20))), 0) << run.err();
  EXPECT_NE(run.out(), "29500\n");
  EXPECT_TRUE(contains(run.err(), "29500")) << run.err();
}

TEST_F(LauncherTest, OutputIsPrefixedPerRank) {
  Launched run({"run", "-n", "2", "--master-port", "0", "sh", "-c",
                "echo hello $RANK; echo oops $RANK >&2; printf 'no newline'"});
  ASSERT_EQ(exit_code(run.wait(seconds(20))), 0) << run.err();
  for (int r = 0; r < 2; ++r) {
    auto tag = "[rank " + std::to_string(r) + "] ";
    EXPECT_TRUE(contains(run.out(), tag + "hello " + std::to_string(r) + "\n")) << run.out();
    EXPECT_TRUE(contains(run.out(), tag + "no newline\n")) << run.out();
    EXPECT_TRUE(contains(run.err(), tag + "oops " + std::to_string(r) + "\n")) << run.err();
    EXPECT_FALSE(contains(run.out(), "oops")) << run.out();
  }
}

// Two ranks writing a traceback line by line at the same moment: each rank's lines stay
// together in `dtrain run`'s output instead of alternating.
TEST_F(LauncherTest, EachRanksBurstOfLinesStaysTogether) {
  Launched run({"run", "-n", "2", "--master-port", "0", "sh", "-c",
                "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo \"frame $i of $RANK\" >&2; "
                "j=0; while [ $j -lt 2000 ]; do j=$((j+1)); done; done"});  // ~1 ms, no fork
  ASSERT_EQ(exit_code(run.wait(seconds(20))), 0) << run.err();
  std::vector<int> order;  // the rank of each frame line, in the order relayed
  std::istringstream lines(run.err());
  for (std::string line; std::getline(lines, line);)
    if (line.find(" frame ") != std::string::npos) order.push_back(line[6] - '0');
  ASSERT_EQ(order.size(), 24u) << run.err();
  int switches = 0;
  for (size_t i = 1; i < order.size(); ++i) switches += order[i] != order[i - 1];
  EXPECT_EQ(switches, 1) << "the ranks' lines interleave:\n" << run.err();
}

TEST_F(LauncherTest, NoPrefixRelaysLinesUntouched) {
  Launched run({"run", "-n", "2", "--master-port", "0", "--no-prefix", "sh", "-c",
                "echo hello $RANK; echo oops >&2"});
  ASSERT_EQ(exit_code(run.wait(seconds(20))), 0) << run.err();
  EXPECT_TRUE(contains(run.out(), "hello 0\n")) << run.out();
  EXPECT_TRUE(contains(run.out(), "hello 1\n")) << run.out();
  EXPECT_FALSE(contains(run.out(), "[rank")) << run.out();
  EXPECT_EQ(count_of(run.err(), "oops\n"), 2u) << run.err();
  EXPECT_FALSE(contains(run.err(), "[rank")) << run.err();
}

TEST_F(LauncherTest, FailingRankStopsTheJobAndIsNamed) {
  // Rank 0 records its pid and becomes a long sleep; rank 1 waits for that, then fails.
  auto pid_file = (dir_ / "pid0").string();
  Launched run({"run", "-n", "2", "--master-port", "0", "sh", "-c",
                "if [ $RANK = 0 ]; then echo $$ > " + pid_file + ".tmp && mv " + pid_file +
                    ".tmp " + pid_file +
                    " && exec sleep 30; fi; "
                    "while [ ! -e " +
                    pid_file +
                    " ]; do sleep 0.01; done; "
                    "echo first >&2; echo boom >&2; exit 7"});
  // Well before rank 0's sleep would end on its own.
  auto status = run.wait(seconds(20));
  EXPECT_EQ(exit_code(status), 7) << run.err();
  EXPECT_TRUE(contains(run.err(), "rank 1")) << run.err();
  EXPECT_TRUE(contains(run.err(), "exit code 7")) << run.err();
  EXPECT_TRUE(contains(run.err(), "boom")) << run.err();
  // One summary line, and it comes last.
  EXPECT_EQ(count_of(run.err(), "dtrain run: rank"), 1u) << run.err();
  auto summary = run.err().substr(run.err().rfind("dtrain run: rank"));
  EXPECT_TRUE(contains(summary, "first\n") && contains(summary, "boom\n")) << summary;
  pid_t rank0 = read_pid(pid_file);
  ASSERT_GT(rank0, 0);
  EXPECT_TRUE(gone_soon(rank0)) << "rank 0 (pid " << rank0 << ") outlived the job";
}

// Workers that exit without a word to the parameter servers (never created a client): the
// servers are stopped after the grace period and the job ends with the workers' status.
TEST_F(LauncherTest, ServersEndWhenEveryWorkerHasExited) {
  for (int code : {0, 3}) {
    Launched run({"run", "--servers", "1", "-n", "2", "--master-port", "0", "--grace-period",
                  "1", "--", "sh", "-c", "exit " + std::to_string(code)});
    auto status = run.wait(seconds(20));
    EXPECT_EQ(exit_code(status), code) << run.err();
    if (code == 0) {
      EXPECT_TRUE(contains(run.err(), "every worker has exited; stopping the 1 service(s)"))
          << run.err();
      EXPECT_FALSE(contains(run.err(), "server 0 (pid")) << run.err();  // no failure summary
    } else {
      EXPECT_TRUE(contains(run.err(), "exit code 3")) << run.err();
    }
  }
}

TEST_F(LauncherTest, RankKilledBySignalIsReportedByName) {
  Launched run({"run", "-n", "2", "--master-port", "0", "sh", "-c",
                "if [ $RANK = 0 ]; then kill -KILL $$; fi; sleep 30"});
  auto status = run.wait(seconds(20));
  EXPECT_EQ(exit_code(status), 128 + SIGKILL) << run.err();
  EXPECT_TRUE(contains(run.err(), "rank 0")) << run.err();
  EXPECT_TRUE(contains(run.err(), "SIGKILL")) << run.err();
}

// Rank 1 is killed from outside, then rank 0 fails with an exit code, as a rank does when a
// peer it works with dies. Both end while the launcher is stopped, so that it finds them in one
// pass, rank 0 first: the summary must still name rank 1.
TEST_F(LauncherTest, TheKilledRankIsNamedNotTheOneThatFailedAfterIt) {
  auto script = "trap 'exit 3' TERM; sleep 30 & echo $$ > " + dir_.string() + "/pid$RANK.tmp && mv " +
                dir_.string() + "/pid$RANK.tmp " + dir_.string() + "/pid$RANK; echo ready; wait";
  Launched run({"run", "-n", "2", "--master-port", "0", "sh", "-c", script});
  ASSERT_TRUE(run.read_until([&] { return count_of(run.out(), "ready") == 2; },
                             Deadline::after(seconds(20))))
      << run.out() << run.err();
  const pid_t rank0 = read_pid(dir_ / "pid0"), rank1 = read_pid(dir_ / "pid1");
  ASSERT_GT(rank0, 0);
  ASSERT_GT(rank1, 0);
  ASSERT_EQ(::kill(run.pid(), SIGSTOP), 0);
  ::kill(rank1, SIGKILL);
  EXPECT_TRUE(gone_soon(rank1));
  ::kill(rank0, SIGTERM);
  EXPECT_TRUE(gone_soon(rank0));
  ASSERT_EQ(::kill(run.pid(), SIGCONT), 0);
  auto status = run.wait(seconds(20));
  EXPECT_EQ(exit_code(status), 128 + SIGKILL) << run.err();
  EXPECT_TRUE(contains(run.err(), "dtrain run: rank 1 (pid " + std::to_string(rank1) + ")"))
      << run.err();
  EXPECT_FALSE(contains(run.err(), "dtrain run: rank 0")) << run.err();
}

TEST_F(LauncherTest, MissingCommandIsAClearError) {
  Launched run({"run", "-n", "2", "--master-port", "0", "dtrain-no-such-command"});
  auto status = run.wait(seconds(20));
  EXPECT_NE(exit_code(status), 0);
  EXPECT_TRUE(contains(run.err(), "dtrain-no-such-command")) << run.err();
  EXPECT_TRUE(contains(run.err(), "not found on PATH")) << run.err();
}

TEST_F(LauncherTest, SigtermReachesEveryWorker) {
  auto script = "trap 'echo term > " + dir_.string() +
                "/term$RANK; exit 0' TERM; echo ready; sleep 30 & wait";
  Launched run({"run", "-n", "2", "--master-port", "0", "sh", "-c", script});
  ASSERT_TRUE(run.read_until([&] { return count_of(run.out(), "ready") == 2; },
                             Deadline::after(seconds(20))))
      << run.out() << run.err();
  ::kill(run.pid(), SIGTERM);
  auto status = run.wait(seconds(20));
  EXPECT_EQ(exit_code(status), 128 + SIGTERM) << run.err();
  EXPECT_TRUE(std::filesystem::exists(dir_ / "term0")) << run.err();
  EXPECT_TRUE(std::filesystem::exists(dir_ / "term1")) << run.err();
}

TEST_F(LauncherTest, WorkerIgnoringSigtermIsKilledAfterTheGracePeriod) {
  auto script =
      "trap '' TERM; sleep 30 & echo $$ $! > " + dir_.string() + "/pids$RANK; echo ready; wait";
  Launched run(
      {"run", "-n", "2", "--master-port", "0", "--grace-period", "0.5", "sh", "-c", script});
  ASSERT_TRUE(run.read_until([&] { return count_of(run.out(), "ready") == 2; },
                             Deadline::after(seconds(20))))
      << run.out() << run.err();
  ::kill(run.pid(), SIGTERM);
  auto status = run.wait(seconds(20));
  EXPECT_EQ(exit_code(status), 128 + SIGTERM) << run.err();
  EXPECT_TRUE(contains(run.err(), "SIGKILL")) << run.err();
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(dir_ / ("pids" + std::to_string(r)));
    pid_t shell = -1, sleeper = -1;
    in >> shell >> sleeper;
    ASSERT_GT(shell, 0);
    ASSERT_GT(sleeper, 0);
    EXPECT_TRUE(gone_soon(shell)) << "rank " << r << " shell " << shell << " survived";
    EXPECT_TRUE(gone_soon(sleeper)) << "rank " << r << " sleep " << sleeper << " survived";
  }
}

TEST_F(LauncherTest, BadArgumentsAreRejected) {
  for (std::vector<std::string> args : {std::vector<std::string>{"run", "-n", "0", "true"},
                                        {"run", "--nnodes", "2", "--node-rank", "2", "true"},
                                        {"run", "--bogus", "true"},
                                        {"run", "-n", "2"}}) {
    Launched run(args);
    EXPECT_NE(exit_code(run.wait(seconds(20))), 0) << args[1];
    EXPECT_FALSE(run.err().empty()) << args[1];
  }
}

// Numbers that used to overflow: into instant SIGKILLs, WORLD_SIZE=-2147483648, bad_alloc.
TEST_F(LauncherTest, HugeOrNonFiniteNumbersAreRefusedNamingTheFlag) {
  for (const auto& [args, says] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"run", "-n", "1", "--grace-period", "inf", "true"}, "--grace-period is inf"},
           {{"run", "-n", "1", "--grace-period", "nan", "true"}, "--grace-period is nan"},
           {{"run", "-n", "2000000000", "true"}, "-n is 2000000000: at most 4096"},
           {{"run", "--nnodes", "1073741824", "-n", "2", "true"}, "makes 2147483648 ranks"},
           {{"bench", "allreduce", "--np", "2", "--deadline", "1e300"}, "--deadline is 1e+300"},
           {{"bench", "allreduce", "--np", "2", "--sizes", "99999999999999999999"},
            "is too large: at most 1G"},
           {{"bench", "allreduce", "--np", "2", "--sizes", "4G"}, "is too large: at most 1G"}}) {
    Launched run(args);
    EXPECT_EQ(exit_code(run.wait(seconds(20))), 2) << args[1] << ": " << run.err();
    EXPECT_TRUE(contains(run.err(), says)) << says << " not in: " << run.err();
  }
}

// What a torchrun or mpirun user types: torchrun's spellings work, mpirun's -np and typos are
// answered with the fix, a bare `dtrain` shows the help, and no message says "dtrain:" twice.
TEST_F(LauncherTest, TorchrunSpellingsWorkAndTyposGetTheFix) {
  Launched torchrun({"run", "--nproc_per_node", "2", "--nnodes", "1", "--node_rank", "0",
                     "--master_addr", "127.0.0.1", "--master_port", "0", "--", "sh", "-c",
                     "echo world $WORLD_SIZE"});
  ASSERT_EQ(exit_code(torchrun.wait(seconds(20))), 0) << torchrun.err();
  EXPECT_EQ(count_of(torchrun.out(), "world 2"), 2) << torchrun.out();
  EXPECT_FALSE(contains(torchrun.err(), "store server: listening")) << torchrun.err();

  for (const auto& [args, says] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"run", "-np", "2", "true"}, "dtrain run: -np is mpirun's spelling; dtrain run takes -n"},
           {{"rn", "-n", "2", "true"}, "dtrain: unknown command 'rn' (did you mean 'run'?)"},
           {{"run", "--nprc-per-node", "2", "true"},
            "dtrain run: unknown option '--nprc-per-node': did you mean --nproc-per-node?"},
           {{"data", "lst", "x"},
            "dtrain: unknown command 'data lst' (did you mean 'list'?): the data commands are write, "
            "inspect, index, list"},
           {{"data"}, "dtrain data needs a command: write, inspect, index, list"}}) {
    Launched run(args);
    EXPECT_EQ(exit_code(run.wait(seconds(20))), 2) << args[0] << ": " << run.err();
    EXPECT_TRUE(contains(run.err(), says)) << says << " not in: " << run.err();
    EXPECT_FALSE(contains(run.err(), "dtrain: dtrain")) << run.err();
  }
  Launched bare(std::vector<std::string>{});
  EXPECT_EQ(exit_code(bare.wait(seconds(20))), 0) << bare.err();
  EXPECT_TRUE(contains(bare.out(), "Subcommands:")) << bare.out();
  EXPECT_TRUE(contains(bare.out(), "run")) << bare.out();
}

// Several workers fail together: the summary names the cause, not the first exit seen. A rank
// whose error blames a peer ("rank 1 ... reports: ...") yields to the peer it blames; a rank the
// others' post-mortems name as silent, still running (stopped, stuck), is named itself.
TEST_F(LauncherTest, TheCauseIsNamedNotTheFirstRankToExit) {
  Launched disk_full(
      {"run", "-n", "2", "--master-port", "0", "--", "sh", "-c",
       "if [ $RANK = 0 ]; then echo 'rank 0: all_reduce failed: rank 1 (world rank 1) reports: "
       "writing ckpt failed' >&2; exit 1; fi; sleep 0.05; "
       "echo 'rank 1: writing ckpt/step-5/model.safetensors failed: No space left on device' >&2; "
       "exit 1"});
  EXPECT_EQ(exit_code(disk_full.wait(seconds(20))), 1) << disk_full.err();
  EXPECT_TRUE(contains(disk_full.err(), "dtrain run: rank 1 (pid ")) << disk_full.err();
  EXPECT_TRUE(contains(disk_full.err(), "the likeliest cause: rank 0 failed first, but its error "
                                        "blames a peer"))
      << disk_full.err();
  EXPECT_TRUE(contains(disk_full.err(), "Last stderr lines of rank 1:\n    rank 1: writing"))
      << disk_full.err();

  Launched stopped(
      {"run", "-n", "3", "--master-port", "0", "--grace-period", "0.5", "--", "sh", "-c",
       "if [ $RANK = 2 ]; then exec sleep 30; fi; sleep 0.05; echo \"rank $RANK: all_reduce "
       "failed: recv timed out. Post-mortem: collective #2 of group world, rank by rank: ranks "
       "0, 1 called all_reduce(f32, 16, sum) and failed; rank 2: did not answer within the "
       "limit (stopped or stuck)\" >&2; exit 1"});
  EXPECT_EQ(exit_code(stopped.wait(seconds(20))), 1) << stopped.err();
  EXPECT_TRUE(contains(stopped.err(), "dtrain run: rank 2 (pid ")) << stopped.err();
  EXPECT_TRUE(contains(stopped.err(), "did not answer its peers (stopped or stuck")) << stopped.err();
}

}  // namespace
}  // namespace dtrain
