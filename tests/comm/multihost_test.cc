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
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

const std::string kScript = std::string(DTRAIN_SOURCE_DIR) + "/scripts/netns-hosts.sh";
const std::string kRank = std::string(DTRAIN_BIN_DIR) + "/multihost_rank";

struct Hosts {
  std::string name;
  std::string subnet;
  bool up = false;
  Hosts() {
    const int id = ::getpid() % 200;
    name = "dt" + std::to_string(::getpid() % 100000);
    subnet = "10.77." + std::to_string(id);
    up = ::geteuid() == 0 &&
         std::system((kScript + " up " + name + " 2 " + subnet + " >/dev/null 2>&1").c_str()) == 0;
    if (!up) std::system((kScript + " down " + name + " 2 >/dev/null 2>&1").c_str());
  }
  ~Hosts() {
    if (up) std::system((kScript + " down " + name + " 2 >/dev/null 2>&1").c_str());
  }
};

struct Rank {
  pid_t pid = -1;
  std::string log;
};

Rank start(const Hosts& hosts, int rank, int port, const std::string& mode) {
  Rank r;
  r.log = ::testing::TempDir() + "/multihost_" + hosts.name + "_" + std::to_string(rank);
  r.pid = ::fork();
  if (r.pid == 0) {
    int fd = ::open(r.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", "4", 1);
    ::setenv("LOCAL_RANK", std::to_string(rank % 2).c_str(), 1);
    ::setenv("LOCAL_WORLD_SIZE", "2", 1);
    ::setenv("MASTER_ADDR", (hosts.subnet + ".1").c_str(), 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    ::setenv("DTRAIN_JOB_ID", hosts.name.c_str(), 1);
    ::setenv("DTRAIN_TIMEOUT", "30", 1);
    ::unsetenv("DTRAIN_AGENT_STORE");
    ::unsetenv("DTRAIN_TRANSPORT");
    std::string host = std::to_string(rank / 2);
    ::execl(kScript.c_str(), kScript.c_str(), "run", hosts.name.c_str(), host.c_str(),
            kRank.c_str(), mode.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return r;
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
  auto ready = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < ready) {
    bool all = true;
    for (int r = 0; r < 4; ++r) all &= slurp(ranks[r].log).find("READY") != std::string::npos;
    if (all) break;
    std::this_thread::sleep_for(20ms);
  }
  std::this_thread::sleep_for(300ms);
  const auto lost = std::chrono::steady_clock::now();
  if (cut_link) {
    ASSERT_EQ(std::system((kScript + " cut " + hosts.name + " 1").c_str()), 0);
  } else {
    ::kill(ranks[2].pid, SIGKILL);
    ::kill(ranks[3].pid, SIGKILL);
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(finish(ranks[r], 30s), 3) << slurp(ranks[r].log);
    const std::string log = slurp(ranks[r].log);
    EXPECT_TRUE(log.find("rank 2") != std::string::npos || log.find("rank 3") != std::string::npos)
        << log;
  }
  const auto took = std::chrono::steady_clock::now() - lost;
  EXPECT_LT(took, 20s) << "survivors took "
                       << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  // An unplugged host's ranks would only give up at their own timeout: end them.
  for (int r = 2; r < 4; ++r) {
    ::kill(ranks[r].pid, SIGKILL);
    finish(ranks[r], 10s);
  }
}

TEST(MultiHost, LosingAHostFailsTheSurvivorsNamingIt) { lose_a_host(false); }
TEST(MultiHost, CuttingAHostsLinkFailsTheSurvivorsNamingIt) { lose_a_host(true); }

}  // namespace
