// Multi-host on one machine: two "hosts" as network namespaces (scripts/netns-hosts.sh), two
// ranks on each. Host detection puts each host's ranks on shared memory and the hosts on TCP;
// the hierarchical all-reduce runs for real; losing a whole host, or its link, fails every
// surviving rank quickly with the lost ranks named. Skipped, with a message, where namespaces
// cannot be made (not root, no iproute2, no permission).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/cost_model.h"

namespace {

using namespace std::chrono_literals;

const std::string kScript = std::string(DTRAIN_SOURCE_DIR) + "/scripts/netns-hosts.sh";
const std::string kRank = std::string(DTRAIN_BIN_DIR) + "/multihost_rank";

struct Hosts {
  std::string name;
  std::string subnet;
  int n = 2;
  bool up = false;
  // `options`: netns-hosts.sh up's (--racks 2, --profile ...).
  explicit Hosts(int hosts = 2, const std::string& options = "") : n(hosts) {
    const int id = ::getpid() % 200;
    name = "dt" + std::to_string(::getpid() % 100000);
    subnet = "10.77." + std::to_string(id);
    up = ::geteuid() == 0 &&
         std::system((kScript + " up " + name + " " + std::to_string(n) + " " + subnet + " " +
                      options + " >/dev/null 2>&1").c_str()) == 0;
    if (!up) std::system((kScript + " down " + name + " >/dev/null 2>&1").c_str());
  }
  ~Hosts() {
    if (up) std::system((kScript + " down " + name + " >/dev/null 2>&1").c_str());
  }
  int script(const std::string& args) const {
    return std::system((kScript + " " + args).c_str());
  }
};

struct Rank {
  pid_t pid = -1;
  std::string log;
};

// Rank `rank` of `world` on host `host`, with `env` ("K=V" each) on top.
Rank start(const Hosts& hosts, int rank, int world, int host, int port, const std::string& mode,
           const std::vector<std::string>& env = {}) {
  Rank r;
  r.log = ::testing::TempDir() + "/multihost_" + hosts.name + "_" + std::to_string(rank);
  r.pid = ::fork();
  if (r.pid == 0) {
    int fd = ::open(r.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
    ::unsetenv("LOCAL_RANK");
    ::unsetenv("LOCAL_WORLD_SIZE");
    ::setenv("MASTER_ADDR", (hosts.subnet + ".1").c_str(), 1);  // rank 0 is on host 0
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    ::setenv("DTRAIN_JOB_ID", hosts.name.c_str(), 1);
    ::setenv("DTRAIN_TIMEOUT", "30", 1);
    ::unsetenv("DTRAIN_AGENT_STORE");
    ::unsetenv("DTRAIN_TRANSPORT");
    ::unsetenv("DTRAIN_TOPOLOGY");
    ::unsetenv("DTRAIN_RACK");
    ::unsetenv("DTRAIN_COST_FILE");
    for (const auto& kv : env) ::putenv(::strdup(kv.c_str()));
    std::string h = std::to_string(host);
    ::execl(kScript.c_str(), kScript.c_str(), "run", hosts.name.c_str(), h.c_str(), kRank.c_str(),
            mode.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return r;
}

Rank start(const Hosts& hosts, int rank, int port, const std::string& mode) {
  return start(hosts, rank, 4, rank / 2, port, mode);
}

// Exit code, or -1 when it had to be killed at the deadline.
int finish(const Rank& r, std::chrono::milliseconds deadline) {
  auto end = std::chrono::steady_clock::now() + deadline;
  for (;;) {
    int status = 0;
    if (::waitpid(r.pid, &status, WNOHANG) == r.pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::steady_clock::now() > end) {
      ::kill(r.pid, SIGKILL);
      ::waitpid(r.pid, nullptr, 0);
      return -1;
    }
    std::this_thread::sleep_for(10ms);
  }
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Until every rank's log holds `text`, or `limit` passes (the checks after say which did not).
void wait_for_all(const std::vector<Rank>& ranks, const std::string& text,
                  std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    bool all = true;
    for (const auto& r : ranks) all &= slurp(r.log).find(text) != std::string::npos;
    if (all) return;
    std::this_thread::sleep_for(20ms);
  }
}

// Ranks [0, survivors) lost the others at `lost`: each must exit 3 naming one of the lost ranks,
// all within `limit`. The lost ranks (cut off, they would wait for their own timeout) are ended.
void expect_survivors_name_the_lost(const std::vector<Rank>& ranks, int survivors,
                                    std::chrono::steady_clock::time_point lost,
                                    std::chrono::seconds deadline, std::chrono::seconds limit) {
  const int n = static_cast<int>(ranks.size());
  for (int r = 0; r < survivors; ++r) {
    EXPECT_EQ(finish(ranks[r], deadline), 3) << slurp(ranks[r].log);
    const std::string log = slurp(ranks[r].log);
    bool named = false;
    for (int l = survivors; l < n; ++l) named |= log.find("rank " + std::to_string(l)) != std::string::npos;
    EXPECT_TRUE(named) << "rank " << r << ":\n" << log;
  }
  const auto took = std::chrono::steady_clock::now() - lost;
  EXPECT_LT(took, limit) << "survivors took "
                         << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  for (int r = survivors; r < n; ++r) {
    ::kill(ranks[r].pid, SIGKILL);
    finish(ranks[r], 10s);
  }
}

TEST(MultiHost, HierarchicalCollectivesAcrossTwoHosts) {
  Hosts hosts;
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  std::vector<Rank> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(start(hosts, r, 29731, "check"));
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(finish(ranks[r], 120s), 0) << slurp(ranks[r].log);
    EXPECT_NE(slurp(ranks[r].log).find("OK rank " + std::to_string(r) + " algo=hierarchical"),
              std::string::npos)
        << slurp(ranks[r].log);
  }
}

void lose_a_host(bool cut_link) {
  Hosts hosts;
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  std::vector<Rank> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(start(hosts, r, 29732, "survive"));
  // Let them get going, then take host 1 away.
  wait_for_all(ranks, "READY", 30s);
  std::this_thread::sleep_for(300ms);
  const auto lost = std::chrono::steady_clock::now();
  if (cut_link) {
    ASSERT_EQ(std::system((kScript + " cut " + hosts.name + " 1").c_str()), 0);
  } else {
    ::kill(ranks[2].pid, SIGKILL);
    ::kill(ranks[3].pid, SIGKILL);
  }
  expect_survivors_name_the_lost(ranks, 2, lost, 30s, 20s);
  if (cut_link) {
    // No FIN, no RST: the kernel gave up on the silent peer, and the error says what that means.
    const std::string logs = slurp(ranks[0].log) + slurp(ranks[1].log);
    EXPECT_NE(logs.find("its host acknowledged nothing for 7 s"), std::string::npos) << logs;
  }
}

TEST(MultiHost, LosingAHostFailsTheSurvivorsNamingIt) { lose_a_host(false); }
TEST(MultiHost, CuttingAHostsLinkFailsTheSurvivorsNamingIt) { lose_a_host(true); }

}  // namespace

// Runs `world` ranks of multihost_rank `mode`, rank r on host host_of[r], and expects each to
// print "OK rank r" (and `want` where given).
void run_all(const Hosts& hosts, const std::vector<int>& host_of, int port, const std::string& mode,
             const std::vector<std::string>& env = {}, const std::string& want = "") {
  const int world = static_cast<int>(host_of.size());
  std::vector<Rank> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(start(hosts, r, world, host_of[r], port, mode, env));
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(finish(ranks[r], 150s), 0) << slurp(ranks[r].log);
    const std::string log = slurp(ranks[r].log);
    EXPECT_NE(log.find("OK rank " + std::to_string(r)), std::string::npos) << log;
    if (!want.empty()) EXPECT_NE(log.find(want), std::string::npos) << "want '" << want << "' in\n" << log;
  }
}

TEST(MultiHost, AnyPlacementOfRanksOnHosts) {
  Hosts hosts;
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  // Ranks alternate between the hosts: the hierarchy's all-gather puts blocks back in rank order.
  run_all(hosts, {0, 1, 0, 1}, 29733, "check", {}, "split=hosts parts=2 per_part=2 uniform");
}

TEST(MultiHost, UnevenHostsRunByLeaders) {
  Hosts hosts;
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  // Three ranks on one host, one on the other.
  run_all(hosts, {0, 0, 1, 0}, 29734, "check", {}, "split=hosts parts=2 per_part=3 uneven");
}

TEST(MultiHost, SixRanksOnThreeHosts) {
  Hosts hosts(3);
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  // Three hosts: the hierarchy's cross groups have three ranks (no power of two), and the flat
  // halving-doubling folds two ranks in, its steps partly over shared memory.
  run_all(hosts, {0, 0, 1, 1, 2, 2}, 29740, "check", {}, "split=hosts parts=3 per_part=2 uniform");
}

TEST(MultiHost, HostsInTwoRacksSplitTwice) {
  Hosts hosts(4, "--racks 2 --profile rate=2gbit --rack-profile rate=500mbit");
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  // Four hosts with two ranks each, racks told through the topology file netns-hosts.sh wrote:
  // the cross groups (one rank per host) split again by rack.
  const std::string topology = "/run/dtrain-netns/" + hosts.name + ".topology.json";
  run_all(hosts, {0, 0, 1, 1, 2, 2, 3, 3}, 29735, "check", {"DTRAIN_TOPOLOGY=" + topology},
          "cross: split=racks parts=2 per_part=2 uniform");
}

TEST(MultiHost, OneRankPerHostSplitsByRack) {
  Hosts hosts(4);
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  // Racks told by DTRAIN_RACK, one rack of three hosts and one of one: uneven, by leaders.
  std::vector<Rank> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.push_back(start(hosts, r, 4, r, 29736, "check", {r < 3 ? "DTRAIN_RACK=a" : "DTRAIN_RACK=b"}));
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(finish(ranks[r], 150s), 0) << slurp(ranks[r].log);
    EXPECT_NE(slurp(ranks[r].log).find("split=racks parts=2 per_part=3 uneven"), std::string::npos)
        << slurp(ranks[r].log);
  }
}

TEST(MultiHost, LossAndADelaySpikeNeitherHangNorCorrupt) {
  Hosts hosts;
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  if (std::system("command -v nft >/dev/null") != 0) GTEST_SKIP() << "needs nft (nftables)";
  ASSERT_EQ(hosts.script("loss " + hosts.name + " 1 2"), 0);  // 2% of host 1's packets, each way
  std::vector<Rank> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(start(hosts, r, 4, r / 2, 29737, "steady"));
  // A 400 ms blackout of host 1 while they run.
  std::this_thread::sleep_for(1500ms);
  ASSERT_EQ(hosts.script("spike " + hosts.name + " 1 400"), 0);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(finish(ranks[r], 150s), 0) << slurp(ranks[r].log);
    EXPECT_NE(slurp(ranks[r].log).find("OK rank " + std::to_string(r)), std::string::npos)
        << slurp(ranks[r].log);
  }
}

TEST(MultiHost, ACorruptCostFileIsNamedAndTheLinksAreMeasured) {
  Hosts hosts;
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  const std::string file = ::testing::TempDir() + "/corrupt_cost_" + hosts.name + ".json";
  std::ofstream(file) << "{\"version\": 1, \"links\": {\"host\": {\"alpha_us\": -3, \"beta_gbps\": 1}}}";
  run_all(hosts, {0, 0, 1, 1}, 29738, "check", {"DTRAIN_COST_FILE=" + file});
  // Rank 0 says what was wrong and that it measured instead; every rank got its figures.
  auto log_of = [&](int r) { return slurp(::testing::TempDir() + "/multihost_" + hosts.name + "_" + std::to_string(r)); };
  const std::string log = log_of(0);
  EXPECT_NE(log.find("'alpha_us' must be a positive number"), std::string::npos) << log;
  EXPECT_NE(log.find("measuring the links at start-up instead"), std::string::npos) << log;
  auto costs = [](const std::string& text) {
    const auto at = text.find("costs=");
    return at == std::string::npos ? std::string("none") : text.substr(at, text.find('\n', at) - at);
  };
  EXPECT_NE(costs(log), "none") << log;
  EXPECT_EQ(costs(log).find("costs=12.0us/4.00GB/s"), std::string::npos) << "the defaults, not a measurement";
  for (int r = 1; r < 4; ++r) EXPECT_EQ(costs(log_of(r)), costs(log)) << "rank " << r;
}

TEST(MultiHost, CuttingAHostInARackedClusterFailsEverySurvivor) {
  Hosts hosts(4, "--racks 2");
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  // Three levels of groups (host, rack, across racks): the failure must reach every rank
  // waiting in any of them.
  const std::string topology = "DTRAIN_TOPOLOGY=/run/dtrain-netns/" + hosts.name + ".topology.json";
  std::vector<Rank> ranks;
  for (int r = 0; r < 8; ++r) ranks.push_back(start(hosts, r, 8, r / 2, 29739, "survive", {topology}));
  wait_for_all(ranks, "READY", 60s);
  EXPECT_NE(slurp(ranks[0].log).find("cross: split=racks"), std::string::npos) << slurp(ranks[0].log);
  std::this_thread::sleep_for(300ms);
  const auto lost = std::chrono::steady_clock::now();
  ASSERT_EQ(hosts.script("cut " + hosts.name + " 3"), 0);
  expect_survivors_name_the_lost(ranks, 6, lost, 40s, 30s);
}

namespace {

// `dtrain bench --netns`: the driver's supervisor starts each rank inside its host's namespace.
TEST(MultiHost, BenchStartsEachRankOnItsEmulatedHost) {
  Hosts hosts;
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  const std::string out = ::testing::TempDir() + "/bench_netns_" + hosts.name;
  const std::string command = std::string(DTRAIN_BIN_DIR) + "/dtrain bench allreduce --np 4 --netns " +
                              hosts.name + " --sizes 4K,1M --iters 3 --warmup 1 --model --json " +
                              out + ".jsonl --calibrate " + out + ".links.json > " + out + ".log 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << slurp(out + ".log");
  const std::string log = slurp(out + ".log");
  // Rank 0 saw two hosts of two ranks each, and both sizes came back right.
  EXPECT_NE(log.find("split=hosts parts=2 per_part=2"), std::string::npos) << log;
  const std::string json = slurp(out + ".jsonl");
  EXPECT_NE(json.find("\"bytes\":4096"), std::string::npos) << json;
  EXPECT_NE(json.find("\"bytes\":1048576"), std::string::npos) << json;
  auto count = [&](const std::string& text) {
    int n = 0;
    for (size_t at = json.find(text); at != std::string::npos; at = json.find(text, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("\"wrong\":0,"), 2) << json;
  EXPECT_EQ(count("\"wrong\":"), 2) << json;
  // The hosts share this machine's cores: the calibration measured what they move together,
  // over TCP and in the hosts' own groups.
  const auto k = dtrain::comm::CostModel::read_file(out + ".links.json");
  EXPECT_GT(k.beta_machine, 0.0) << slurp(out + ".links.json");
  EXPECT_GT(k.beta_machine_shm, 0.0) << slurp(out + ".links.json");
}

// `--algo all` on an emulated cluster times what its shape allows: the hierarchical form only
// where some host holds two ranks (a rank asked for one it cannot run fails the whole bench).
TEST(MultiHost, BenchAlgoAllTimesWhatTheClusterCanRun) {
  Hosts hosts;
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  for (int np : {2, 4}) {
    const std::string out = ::testing::TempDir() + "/bench_all_" + hosts.name + std::to_string(np);
    const std::string command = std::string(DTRAIN_BIN_DIR) + "/dtrain bench allreduce --np " +
                                std::to_string(np) + " --netns " + hosts.name +
                                " --algo all --sizes 4K --iters 3 --warmup 1 > " + out +
                                ".log 2>&1";
    ASSERT_EQ(std::system(command.c_str()), 0) << slurp(out + ".log");
    const std::string log = slurp(out + ".log");
    for (const char* name : {"dtrain-ring(us)", "dtrain-recursive_doubling(us)", "dtrain-central(us)"})
      EXPECT_NE(log.find(name), std::string::npos) << name << " with " << np << " ranks:\n" << log;
    EXPECT_EQ(log.find("dtrain-hierarchical(us)") != std::string::npos, np == 4) << log;
    EXPECT_EQ(log.find("dtrain-direct"), std::string::npos) << "no rank reads another host's memory\n" << log;
  }
}

// `dtrain predict` against a measurement. Two hosts whose link is shaped to 200 Mbit/s, so that
// the link, not this machine's two cores, sets the time; the links calibrated there as a user
// would (`dtrain bench --calibrate`). The data-parallel step of a model of 1M parameters, with
// its 4 MiB of gradients in one bucket and a ring all-reduce, must spend in communication what
// the all-reduce of 4 MiB measured on the same hosts takes, within 25% either way.
TEST(MultiHost, PredictedCommunicationMatchesTheMeasuredAllReduce) {
  Hosts hosts(2, "--profile rate=200mbit,delay=100us");
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  const std::string out = ::testing::TempDir() + "/predict_" + hosts.name;
  const std::string dtrain = std::string(DTRAIN_BIN_DIR) + "/dtrain";
  const std::string calibrate = dtrain + " bench allreduce --np 2 --netns " + hosts.name +
                                " --sizes 4K --iters 5 --warmup 2 --calibrate " + out +
                                ".links.json > " + out + ".calibrate.log 2>&1";
  ASSERT_EQ(std::system(calibrate.c_str()), 0) << slurp(out + ".calibrate.log");
  const std::string measure = dtrain + " bench allreduce --np 2 --netns " + hosts.name +
                              " --sizes 4M --iters 5 --warmup 1 --algo ring --json " + out +
                              ".jsonl > " + out + ".measure.log 2>&1";
  ASSERT_EQ(std::system(measure.c_str()), 0) << slurp(out + ".measure.log");
  const std::string predict = dtrain + " predict --params 1048576 --compute-ms 1 --per-host 1 " +
                              "--ranks 2 --layouts ddp-ring --network " + out + ".links.json --csv " +
                              out + ".csv > " + out + ".predict.log 2>&1";
  ASSERT_EQ(std::system(predict.c_str()), 0) << slurp(out + ".predict.log");

  std::smatch m;
  const std::string json = slurp(out + ".jsonl");
  ASSERT_TRUE(std::regex_search(json, m, std::regex("\"time_us\":([0-9.eE+-]+)"))) << json;
  const double measured_ms = std::stod(m[1]) / 1e3;
  const std::string csv = slurp(out + ".csv");  // ranks,layout,step_ms,comm_ms,exposed_ms,...
  ASSERT_TRUE(std::regex_search(csv, m, std::regex("\n2,ddp-ring,[0-9.eE+-]+,([0-9.eE+-]+),")))
      << csv;
  const double predicted_ms = std::stod(m[1]);
  const std::string both = "measured " + std::to_string(measured_ms) + " ms, predicted " +
                           std::to_string(predicted_ms) + " ms\n" + slurp(out + ".links.json") +
                           "\n" + csv;
  // The link alone moves 4 MiB in 168 ms: a measurement far below that did not cross it.
  EXPECT_GT(measured_ms, 120.0) << both;
  EXPECT_GT(measured_ms / predicted_ms, 0.8) << both;
  EXPECT_LT(measured_ms / predicted_ms, 1.25) << both;
}

}  // namespace
