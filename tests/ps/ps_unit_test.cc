// The parameter server's pure parts: placement, the consistency rules, role resolution.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>

#include "dtrain/error.h"
#include "dtrain/ps_cluster.h"
#include "ps/placement.h"
#include "ps/server_checkpoint.h"
#include "ps/table_spec.h"
#include "ps/worker_clocks.h"

namespace dtrain::ps {
namespace {

// A model's tables placed in order (a ResNet-like mix of a few large and many small tensors)
// load the servers within 10% of each other, and large tensors are cut across all of them.
TEST(PsPlacement, BalancesBytesAcrossServers) {
  std::vector<uint64_t> sizes = {2'359'296, 9408, 64, 64, 36'864, 64, 64, 1'179'648, 128, 128,
                                 147'456,   256,  256, 589'824, 512, 512, 2'048'000, 1000};
  for (int i = 0; i < 40; ++i) sizes.push_back(1000 + 37 * i);
  for (int servers : {2, 3, 4}) {
    std::vector<uint64_t> load(servers, 0);
    for (uint64_t n : sizes) {
      auto slices = place_dense(n, load);
      uint64_t covered = 0;
      for (const auto& s : slices) {
        EXPECT_EQ(s.offset, covered);
        covered += s.length;
      }
      EXPECT_EQ(covered, n);
      if (n * sizeof(float) >= kCutBytes) EXPECT_EQ(slices.size(), static_cast<size_t>(servers));
    }
    auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    EXPECT_LE(static_cast<double>(*hi) / *lo, 1.10) << servers << " servers";
  }
}

// Small tables alone: a naive key-range split would put them all on server 0.
TEST(PsPlacement, SpreadsSmallTables) {
  std::vector<uint64_t> load(4, 0);
  std::map<int, int> tables_on;
  for (int i = 0; i < 100; ++i) tables_on[place_dense(100, load)[0].server]++;
  for (int s = 0; s < 4; ++s) EXPECT_EQ(tables_on[s], 25);
}

// Row ids, even regular ones (multiples of the server count), spread evenly.
TEST(PsPlacement, SparseRowsSpreadEvenly) {
  for (uint64_t stride : {1ull, 4ull, 1024ull}) {
    std::vector<int> count(4, 0);
    for (uint64_t i = 0; i < 40'000; ++i) count[server_of_row(i * stride, 4)]++;
    for (int c : count) EXPECT_NEAR(c, 10'000, 400) << "stride " << stride;
  }
}

TEST(PsClocks, SyncReadsWaitForEveryWorkersPush) {
  WorkerClocks c(Consistency::kSync, 0, 3);
  EXPECT_TRUE(c.blockers(0).empty());  // nothing pushed: the initial values are readable
  c.on_push(0);
  EXPECT_EQ(c.blockers(0), (std::vector<int>{1, 2}));
  c.on_push(1);
  EXPECT_EQ(c.blockers(0), (std::vector<int>{2}));
  EXPECT_FALSE(c.complete(0));
  c.set_presence(2, WorkerClocks::Presence::kLeft);  // a worker that left no longer counts
  EXPECT_TRUE(c.complete(0));
  c.on_applied();
  EXPECT_TRUE(c.blockers(0).empty());
  c.set_presence(2, WorkerClocks::Presence::kFailed);  // a failed one does, to be named
  c.on_push(0);
  c.on_push(1);
  EXPECT_EQ(c.blockers(0), (std::vector<int>{2}));
}

TEST(PsClocks, BoundedStalenessLetsAWorkerLeadByS) {
  WorkerClocks c(Consistency::kBounded, 2, 2);
  for (int i = 0; i < 2; ++i) c.on_push(0);
  EXPECT_TRUE(c.blockers(0).empty());  // 2 ahead of worker 1: allowed
  c.on_push(0);
  EXPECT_EQ(c.blockers(0), (std::vector<int>{1}));  // 3 ahead: waits
  c.on_push(1);
  EXPECT_TRUE(c.blockers(0).empty());
  WorkerClocks a(Consistency::kAsync, 0, 2);
  for (int i = 0; i < 50; ++i) a.on_push(0);
  EXPECT_TRUE(a.blockers(0).empty());
}

TEST(PsSpec, MismatchNamesTheField) {
  TableSpec a;
  a.name = "w";
  a.numel = 8;
  a.slice_length = 8;
  TableSpec b = a;
  EXPECT_EQ(spec_mismatch(a, b), "");
  b.numel = 16;
  EXPECT_NE(spec_mismatch(a, b).find("numel is 16 in the request but 8"), std::string::npos);
  TableSpec c = spec_from_json(to_json(a));
  EXPECT_EQ(spec_mismatch(a, c), "");
  EXPECT_THROW(spec_from_json(nlohmann::json{{"name", "x"}}), InvalidArgumentError);
}

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(PsCluster, ReadsDtrainRoles) {
  auto c = resolve_cluster(env_of({{"DTRAIN_ROLE", "server"},
                                   {"DTRAIN_NUM_SERVERS", "2"},
                                   {"DTRAIN_PS_INDEX", "1"},
                                   {"WORLD_SIZE", "4"},
                                   {"MASTER_ADDR", "10.0.0.1"},
                                   {"MASTER_PORT", "1234"}}));
  EXPECT_EQ(c.role, Cluster::Role::kServer);
  EXPECT_EQ(c.index, 1);
  EXPECT_EQ(c.num_servers, 2);
  EXPECT_EQ(c.num_workers, 4);
  EXPECT_EQ(c.store_addr, "10.0.0.1");
  EXPECT_EQ(c.store_port, 1234);
  auto w = resolve_cluster(env_of({{"DTRAIN_ROLE", "worker"}, {"DTRAIN_NUM_SERVERS", "2"},
                                   {"RANK", "3"}, {"DTRAIN_NUM_WORKERS", "4"}}));
  EXPECT_EQ(w.role, Cluster::Role::kWorker);
  EXPECT_EQ(w.index, 3);
  EXPECT_THROW(resolve_cluster(env_of({{"DTRAIN_ROLE", "server"}, {"DTRAIN_NUM_SERVERS", "2"},
                                       {"DTRAIN_PS_INDEX", "2"}})),
               InvalidArgumentError);
  EXPECT_THROW(resolve_cluster(env_of({{"DTRAIN_ROLE", "boss"}, {"DTRAIN_NUM_SERVERS", "1"}})),
               InvalidArgumentError);
  EXPECT_THROW(resolve_cluster(env_of({})), InvalidArgumentError);
}

TEST(PsCluster, ReadsTfConfig) {
  const std::string cluster =
      R"("cluster": {"chief": ["c:1"], "worker": ["w0:2", "w1:3"], "ps": ["p0:4", "p1:5"]})";
  auto ps1 = resolve_cluster(
      env_of({{"TF_CONFIG", "{" + cluster + R"(, "task": {"type": "ps", "index": 1}})"}}));
  EXPECT_EQ(ps1.role, Cluster::Role::kServer);
  EXPECT_EQ(ps1.index, 1);
  EXPECT_EQ(ps1.servers, (std::vector<std::string>{"p0:4", "p1:5"}));
  EXPECT_EQ(ps1.num_workers, 3);
  auto w1 = resolve_cluster(
      env_of({{"TF_CONFIG", "{" + cluster + R"(, "task": {"type": "worker", "index": 1}})"}}));
  EXPECT_EQ(w1.role, Cluster::Role::kWorker);
  EXPECT_EQ(w1.index, 2);  // after the chief
  auto chief = resolve_cluster(
      env_of({{"TF_CONFIG", "{" + cluster + R"(, "task": {"type": "chief", "index": 0}})"}}));
  EXPECT_EQ(chief.index, 0);
}

TEST(PsCluster, ReadsPsLiteVariables) {
  auto c = resolve_cluster(env_of({{"DMLC_ROLE", "server"},
                                   {"DMLC_NUM_SERVER", "2"},
                                   {"DMLC_NUM_WORKER", "3"},
                                   {"DMLC_PS_ROOT_URI", "10.1.1.1"},
                                   {"DMLC_PS_ROOT_PORT", "9000"}}));
  EXPECT_EQ(c.role, Cluster::Role::kServer);
  EXPECT_EQ(c.index, -1);  // handed out by the scheduler's store
  EXPECT_EQ(c.num_workers, 3);
  EXPECT_EQ(c.store_addr, "10.1.1.1");
  EXPECT_EQ(c.store_port, 9000);
  EXPECT_THROW(resolve_cluster(env_of({{"DMLC_ROLE", "worker"}, {"DMLC_NUM_SERVER", "1"},
                                       {"DMLC_NUM_WORKER", "1"}})),
               InvalidArgumentError);
}

}  // namespace
}  // namespace dtrain::ps

namespace dtrain::ps {
namespace {

// A save that runs out of space (RLIMIT_FSIZE in a child: every write past 4 KiB is EFBIG, as a
// full disk's are ENOSPC) fails as ResourceExhaustedError naming the checkpoint, leaves nothing
// half-written, and the previous checkpoint still loads.
TEST(PsCheckpoint, AFullDiskFailsTheSaveAndKeepsThePreviousCheckpoint) {
  namespace fs = std::filesystem;
  std::string dir = (fs::temp_directory_path() / "dtrain-ps-ckpt-XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  auto table = [](size_t floats, float value) {
    CheckpointData d;
    d.manifest = {{"server", 0}};
    std::vector<float> v(floats, value);
    SafetensorsEntry e{"t", "F32", {static_cast<int64_t>(floats)},
                       std::vector<std::byte>(floats * sizeof(float))};
    std::memcpy(e.data.data(), v.data(), e.data.size());
    d.tensors.push_back(std::move(e));
    return d;
  };
  const std::string first = write_checkpoint(dir, table(4, 7.0f), 3);
  const pid_t child = ::fork();
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    try {
      write_checkpoint(dir, table(1 << 18, 1.0f), 3);
      ::_exit(2);
    } catch (const ResourceExhaustedError& e) {
      const std::string m = e.what();
      ::_exit(m.find("ps checkpoint 2 in " + dir) != std::string::npos &&
                      m.find("File too large") != std::string::npos
                  ? 0
                  : 3);
    } catch (...) {
      ::_exit(4);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: the save succeeded; 3: wrong message; 4: wrong kind";
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"ckpt-000001"}) << "a half-written save stayed";
  const auto latest = read_latest_checkpoint(dir);
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->first, first);
  float v = 0;
  std::memcpy(&v, latest->second.tensors.at(0).data.data(), sizeof v);
  EXPECT_EQ(v, 7.0f);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dtrain::ps
