// dtrain under the launchers people use, for real where this machine allows it:
//  * OpenMPI's mpirun (as root: --allow-run-as-root --oversubscribe): ranks from OMPI_COMM_WORLD_*,
//    the store from MASTER_ADDR/MASTER_PORT or, without them, through MPI; train_fashion_mnist.
//  * Slurm: srun and deploy/slurm/train.sbatch on a throwaway single-node Slurm (slurm_cluster.h),
//    skipped with the reason where it cannot start (not root, not installed, daemons not up).
//  * Kubernetes: no cluster here, so the manifests of deploy/k8s are parsed and each pod's
//    environment (what the Job controller or the training operator injects, plus the manifest's)
//    is fed to resolve_identity.
// The rank program is engines_worker (engines_worker.cc): it all-reduces and prints a RESULT line.
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "command.h"
#include "common/env.h"
#include "common/socket.h"
#include "dtrain/error.h"
#include "dtrain/identity.h"
#include "dtrain/process_group.h"
#include "slurm_cluster.h"
#include "support/multiproc.h"

namespace dtrain {
namespace {

using json = nlohmann::json;
using testing::CommandOptions;
using testing::CommandResult;
using testing::run_command;

const std::string kBin = DTRAIN_BIN_DIR;
const std::string kSource = DTRAIN_SOURCE_DIR;
const std::string kWorker = kBin + "/engines_worker";         // dtrain_core only
const std::string kWorkerMpi = kBin + "/engines_worker_mpi";  // also the MPI backend

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The RESULT lines of the output, by rank.
std::vector<json> results_of(const std::string& output) {
  std::vector<json> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    size_t at = line.find("RESULT {");
    if (at == std::string::npos) continue;
    json j = json::parse(line.substr(at + 7), nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) out.push_back(j);
  }
  std::sort(out.begin(), out.end(),
            [](const json& a, const json& b) { return a.value("rank", -1) < b.value("rank", -1); });
  return out;
}

// Every rank of a `world`-rank group reported, from `source`, with the right all-reduce.
void expect_group(const CommandResult& r, int world, const std::string& source) {
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  auto results = results_of(r.output);
  ASSERT_EQ(results.size(), static_cast<size_t>(world)) << r.output;
  for (int rank = 0; rank < world; ++rank) {
    const json& j = results[rank];
    EXPECT_EQ(j["rank"], rank) << j;
    EXPECT_EQ(j["world_size"], world) << j;
    EXPECT_EQ(j["source"], source) << j;
    EXPECT_EQ(j["sum"], world * (world + 1) / 2) << j;
    EXPECT_EQ(j["max"], world - 1) << j;
    EXPECT_EQ(j["ok"], true) << j;
  }
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// ---------------------------------------------------------------------------------------------
// mpirun

// mpirun as a user types it, plus what running as root in a container needs.
std::vector<std::string> mpirun(int np, std::vector<std::string> extra) {
  std::vector<std::string> argv = {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np",
                                   std::to_string(np)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

CommandOptions debug_env() {
  CommandOptions o;
  o.env = {{"DTRAIN_LOG_LEVEL", "debug"}, {"DTRAIN_CONNECT_TIMEOUT", "60"}};
  o.timeout = std::chrono::seconds(90);
  return o;
}

#define SKIP_WITHOUT_MPIRUN()                  \
  if (testing::find_program("mpirun").empty()) \
  GTEST_SKIP() << "mpirun is not installed "   \
                  "(Debian: openmpi-bin)"

#ifdef DTRAIN_HAVE_MPI_WORKER
TEST(MpirunTest, RanksFromOpenMpiAndTheStoreThroughMpi) {
  SKIP_WITHOUT_MPIRUN();
  CommandResult r = run_command(mpirun(3, {kWorkerMpi}), debug_env());
  expect_group(r, 3, "openmpi");
  for (const json& j : results_of(r.output)) {
    EXPECT_EQ(j["local_rank"], j["rank"]) << j;
    EXPECT_EQ(j["local_world_size"], 3) << j;
    EXPECT_EQ(j["node_rank"], 0) << j;
  }
  // No MASTER_ADDR/MASTER_PORT: rank 0 took a free port and told the others through MPI.
  EXPECT_EQ(count_of(r.output, "published to 3 ranks as 127.0.0.1:"), 1u) << r.output;
  EXPECT_EQ(count_of(r.output, "published by rank 0 through MPI_COMM_WORLD"), 2u) << r.output;
}

TEST(MpirunTest, MasterAddrAndPortWinOverMpi) {
  SKIP_WITHOUT_MPIRUN();
  const int port = testing::free_port();
  CommandResult r = run_command(mpirun(3, {"-x", "MASTER_ADDR=127.0.0.1", "-x",
                                           fmt::format("MASTER_PORT={}", port), kWorkerMpi}),
                                debug_env());
  expect_group(r, 3, "openmpi");
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_EQ(
        count_of(r.output, fmt::format("rank {} of 3 (openmpi), store 127.0.0.1:{}", rank, port)),
        1u)
        << r.output;
  EXPECT_EQ(count_of(r.output, "published"), 0u) << r.output;
}

TEST(MpirunTest, RankZeroThatCannotHostTheStoreFailsEveryRankAtOnce) {
  SKIP_WITHOUT_MPIRUN();
  // The port rank 0 is told to use is taken (by this test): it cannot listen there.
  net::Fd taken = net::listen_tcp("", 0);
  const int port = net::local_port(taken.get());
  CommandResult r =
      run_command(mpirun(3, {"-x", fmt::format("MASTER_PORT={}", port), kWorkerMpi}), debug_env());
  EXPECT_FALSE(r.ok()) << r.output;
  EXPECT_FALSE(r.timed_out) << r.output;
  // The others learn rank 0's reason through MPI instead of waiting out the 60 s connect limit.
  EXPECT_LT(r.seconds, 30) << r.output;
  EXPECT_NE(r.output.find(fmt::format("cannot listen on *:{}", port)), std::string::npos)
      << r.output;
  // mpirun may stop the job as soon as the first rank exits, so at least one of the others.
  EXPECT_GE(
      count_of(r.output, ": rank 0 could not start the rendezvous store, so no rank can join"), 1u)
      << r.output;
}

TEST(MpirunTest, ALateRankZeroFailsTheOthersAtTheConnectLimit) {
  SKIP_WITHOUT_MPIRUN();
  // MPI_Init waits for every rank: the others must give up at DTRAIN_CONNECT_TIMEOUT, not hang.
  CommandOptions o = debug_env();
  o.env["DTRAIN_CONNECT_TIMEOUT"] = "2";
  CommandResult r = run_command(mpirun(3, {kWorkerMpi, "--late-rank0", "60"}), o);
  EXPECT_FALSE(r.ok()) << r.output;
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;  // mpirun stops rank 0 once another rank failed
  EXPECT_GE(count_of(r.output, "of 3: MPI_Init did not finish within 2.0 s of a 2 s limit"), 1u)
      << r.output;
}
#endif

TEST(MpirunTest, OneNodeWithoutMpiInTheProgramUsesLoopbackAndMasterPort) {
  SKIP_WITHOUT_MPIRUN();
  const int port = testing::free_port();
  CommandResult r =
      run_command(mpirun(3, {"-x", fmt::format("MASTER_PORT={}", port), kWorker}), debug_env());
  expect_group(r, 3, "openmpi");
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_EQ(
        count_of(r.output, fmt::format("rank {} of 3 (openmpi), store 127.0.0.1:{}", rank, port)),
        1u)
        << r.output;
}

// Sets environment variables for one test and restores them afterwards.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::map<std::string, std::optional<std::string>> vars) {
    for (auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      set(name, value);
    }
  }
  ~ScopedEnv() {
    for (auto& [name, value] : saved_) set(name, value);
  }

 private:
  static void set(const std::string& name, const std::optional<std::string>& value) {
    if (value)
      ::setenv(name.c_str(), value->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

// This test binary has no MPI: a job over several nodes cannot find rank 0 and must say so
// before touching the network.
TEST(StoreDiscoveryTest, SeveralNodesWithoutMpiSayWhatToSet) {
  ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "1"},
                 {"OMPI_COMM_WORLD_SIZE", "4"},
                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                 {"RANK", std::nullopt},
                 {"WORLD_SIZE", std::nullopt},
                 {"MASTER_ADDR", std::nullopt},
                 {"MASTER_PORT", std::nullopt},
                 {"DTRAIN_BACKEND", std::nullopt},
                 {"DTRAIN_AGENT_STORE", std::nullopt}});
  try {
    init_process_group();
    ADD_FAILURE() << "init_process_group succeeded";
  } catch (const InvalidArgumentError& e) {
    std::string m = e.what();
    for (const char* part : {"rank 1 of 4", "2 of its 4 processes", "MASTER_ADDR is not set",
                             "mpirun -x MASTER_ADDR=", "dtrain_backends"})
      EXPECT_NE(m.find(part), std::string::npos) << "'" << part << "' missing from: " << m;
  }
}

#ifdef DTRAIN_HAVE_TRAIN_FASHION_MNIST
TEST(MpirunTest, TrainFashionMnist) {
  SKIP_WITHOUT_MPIRUN();
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "no Fashion-MNIST data (Debian: dataset-fashion-mnist)";
  CommandOptions o;
  o.timeout = std::chrono::seconds(150);
  CommandResult r = run_command(
      mpirun(3, {kBin + "/train_fashion_mnist", "--max-steps", "20", "--threads", "1"}), o);
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  auto results = results_of(r.output);
  ASSERT_EQ(results.size(), 1u) << r.output;  // rank 0 alone prints it
  const json& j = results[0];
  EXPECT_EQ(j["world_size"], 3) << j;
  EXPECT_EQ(j["strategy"], "ddp") << j;
  EXPECT_EQ(j["steps"], 20) << j;
  EXPECT_LT(j["final_loss"].get<double>(), j["initial_loss"].get<double>()) << j;
  EXPECT_GT(j["test_accuracy"].get<double>(), 0.4) << j;  // 10 classes: chance is 0.1
}
#endif

// ---------------------------------------------------------------------------------------------
// Slurm

#define START_SLURM(cluster)     \
  testing::SlurmCluster cluster; \
  if (!cluster.up()) GTEST_SKIP() << cluster.skip_reason()

TEST(SlurmTest, SrunTasksFindTheirRanksAndTheMaster) {
  START_SLURM(cluster);
  const int port = testing::free_port();
  CommandOptions o;
  o.env = cluster.client_env();
  o.env["MASTER_PORT"] = std::to_string(port);  // this machine may run other jobs on 29500
  o.env["DTRAIN_CONNECT_TIMEOUT"] = "60";
  CommandResult r = run_command({"srun", "-N1", "-n3", kWorker}, o);
  if (!r.ok()) std::cerr << cluster.logs();
  expect_group(r, 3, "slurm");
  for (const json& j : results_of(r.output)) {
    EXPECT_EQ(j["master_addr"], cluster.node()) << j;  // the first host of SLURM_JOB_NODELIST
    EXPECT_EQ(j["master_port"], port) << j;
    EXPECT_EQ(j["local_rank"], j["rank"]) << j;
    EXPECT_EQ(j["local_world_size"], 3) << j;  // from SLURM_TASKS_PER_NODE
    EXPECT_EQ(j["node_rank"], 0) << j;
  }
}

// Submits a batch job and waits for its end (polling scontrol: sbatch --wait polls only every
// few seconds); returns "JobState ExitCode", e.g. "COMPLETED 0:0", or "" after scancel at the
// deadline.
std::string run_batch_job(const testing::SlurmCluster& cluster, std::vector<std::string> sbatch,
                          std::chrono::milliseconds limit) {
  CommandOptions o;
  o.env = cluster.client_env();
  o.env["DTRAIN_CONNECT_TIMEOUT"] = "60";
  o.cwd = cluster.dir();
  sbatch.insert(sbatch.begin(), {"sbatch", "--parsable"});
  CommandResult submit = run_command(sbatch, o);
  EXPECT_TRUE(submit.ok()) << submit.describe() << "\n" << submit.output;
  if (!submit.ok()) return "";
  const std::string id = submit.output.substr(0, submit.output.find_first_of(";\n"));
  const auto end = std::chrono::steady_clock::now() + limit;
  std::smatch m;
  while (std::chrono::steady_clock::now() < end) {
    CommandResult show = run_command({"scontrol", "-o", "show", "job", id}, o);
    static const std::regex kState("JobState=(\\w+) .*? ExitCode=(\\d+:\\d+)");
    if (std::regex_search(show.output, m, kState) && m[1] != "PENDING" && m[1] != "RUNNING" &&
        m[1] != "CONFIGURING" && m[1] != "COMPLETING")
      return m[1].str() + " " + m[2].str();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  run_command({"scancel", id}, o);
  ADD_FAILURE() << "batch job " << id << " did not end within " << limit.count() << " ms";
  return "";
}

TEST(SlurmTest, TheSbatchExampleRuns) {
  START_SLURM(cluster);
  const std::string out = cluster.dir() + "/job.out";
  const std::string state = run_batch_job(cluster,
                                          {"-N1", "--ntasks-per-node=3", "--output=" + out,
                                           kSource + "/deploy/slurm/train.sbatch", kWorker},
                                          std::chrono::seconds(60));
  const std::string job = read_file(out);
  ASSERT_EQ(state, "COMPLETED 0:0") << "job output:\n" << job << "\n" << cluster.logs();
  // The script names the store: the first node, and a port of the job's own.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(job, m, std::regex("store at ([^:\\s]+):(\\d+)"))) << job;
  EXPECT_EQ(m[1].str(), cluster.node());
  const int port = std::stoi(m[2].str());
  EXPECT_GE(port, 20000);
  EXPECT_LT(port, 30000);
  CommandResult as_result;
  as_result.exit_code = 0;
  as_result.output = job;
  expect_group(as_result, 3, "slurm");
  for (const json& j : results_of(job)) {
    EXPECT_EQ(j["master_addr"], cluster.node()) << j;
    EXPECT_EQ(j["master_port"], port) << j;
    EXPECT_EQ(j["local_world_size"], 3) << j;
  }
}

// Preemption under Slurm, as the cluster does it: SIGUSR1 to every task of the job (what
// `--signal=USR1@90` and a preempting scheduler send), the ranks stop after one step and save
// it, train.sbatch requeues the job, and the requeued job resumes: every sample trained once.
TEST(SlurmTest, APreemptedJobIsRequeuedAndResumesWithEverySampleOnce) {
  START_SLURM(cluster);
  const std::string dir = cluster.dir() + "/preempt", out = cluster.dir() + "/preempt.out";
  std::filesystem::create_directories(dir);
  CommandOptions o;
  o.env = cluster.client_env();
  o.env["DTRAIN_CONNECT_TIMEOUT"] = "60";
  o.cwd = cluster.dir();
  const int steps = 150;
  CommandResult submit = run_command(
      {"sbatch", "--parsable", "-N1", "--ntasks-per-node=3", "--output=" + out,
       kSource + "/deploy/slurm/train.sbatch", std::string(DTRAIN_BIN_DIR) + "/preempt_worker",
       "--dir", dir, "--steps", std::to_string(steps), "--step-ms", "20"},
      o);
  ASSERT_TRUE(submit.ok()) << submit.describe() << "\n" << submit.output;
  const std::string id = submit.output.substr(0, submit.output.find_first_of(";\n"));
  auto samples = [&] {
    std::ifstream in(dir + "/samples");
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (samples().size() < 10 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_GE(samples().size(), 10u) << read_file(out) << cluster.logs();
  CommandResult warn = run_command({"scancel", "--signal=USR1", id}, o);
  ASSERT_TRUE(warn.ok()) << warn.output;
  std::string state;
  bool hurried = false;
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (std::chrono::steady_clock::now() < deadline) {
    CommandResult show = run_command({"scontrol", "-o", "show", "job", id}, o);
    // Slurm lets a requeued job start again only 2 minutes later (its begin time); the test
    // moves that time to now rather than wait.
    if (!hurried && show.output.find("Reason=BeginTime") != std::string::npos) {
      hurried = run_command({"scontrol", "update", "JobId=" + id, "StartTime=now"}, o).ok();
    }
    std::smatch m;
    static const std::regex kState("JobState=(\\w+) .*?Restarts=(\\d+)");
    if (std::regex_search(show.output, m, kState) && m[1] == "COMPLETED") {
      state = m[1].str() + " restarts " + m[2].str();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  const std::string job = read_file(out);
  ASSERT_EQ(state, "COMPLETED restarts 1")
      << job << "\n"
      << run_command({"scontrol", "-o", "show", "job", id}, o).output << cluster.logs();
  EXPECT_NE(job.find("saved its state for a requeue (restart 0); requeueing"), std::string::npos)
      << job;
  EXPECT_NE(job.find("resumed from step"), std::string::npos) << job;
  std::map<std::string, int> count;
  for (const auto& l : samples()) ++count[l];
  EXPECT_EQ(count.size(), static_cast<size_t>(steps)) << job;
  for (int s = 0; s < steps; ++s) EXPECT_EQ(count["sample " + std::to_string(s)], 1) << s;
}

// `dtrain submit --engine slurm` on a throwaway Slurm: a short job runs to its end (its output
// through `dtrain logs`, its start and end told to the notify command), a long one is listed by
// `dtrain jobs` and ended by `dtrain cancel`; --placement auto spreads on an idle cluster.
TEST(SlurmTest, SubmitListLogsAndCancelThroughDtrain) {
  START_SLURM(cluster);
  CommandOptions o;
  o.env = cluster.client_env();
  o.env["DTRAIN_CONNECT_TIMEOUT"] = "60";
  o.cwd = cluster.dir();
  const std::string dtrain = kBin + "/dtrain", worker = kBin + "/preempt_worker";
  const std::string logs = cluster.dir() + "/logs", events = cluster.dir() + "/events";
  auto submit = [&](const std::string& name, int steps) {
    std::filesystem::create_directories(cluster.dir() + "/" + name);
    CommandResult r = run_command(
        {dtrain, "submit", "--engine", "slurm", "--name", name, "--procs-per-node", "2",
         "--log-dir", logs, "--notify-command",
         "echo \"$DTRAIN_JOB_NAME $DTRAIN_JOB_EVENT $DTRAIN_JOB_STATUS\" >> " + events, "--",
         worker, "--dir", cluster.dir() + "/" + name, "--steps", std::to_string(steps)},
        o);
    EXPECT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(r.output, m, std::regex("submitted job (\\d+) to Slurm")))
        << r.output;
    EXPECT_NE(r.output.find("placement spread (100% of the cluster's CPUs idle)"),
              std::string::npos)
        << r.output;
    return m.size() > 1 ? m[1].str() : std::string();
  };
  auto state_of = [&](const std::string& id, std::chrono::seconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    std::smatch m;
    while (std::chrono::steady_clock::now() < end) {
      CommandResult show = run_command({"scontrol", "-o", "show", "job", id}, o);
      if (std::regex_search(show.output, m, std::regex("JobState=(\\w+)")) && m[1] != "PENDING" &&
          m[1] != "RUNNING" && m[1] != "CONFIGURING" && m[1] != "COMPLETING")
        return m[1].str();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return std::string("still running");
  };
  const std::string short_job = submit("short", 5);
  ASSERT_FALSE(short_job.empty());
  ASSERT_EQ(state_of(short_job, std::chrono::seconds(60)), "COMPLETED") << cluster.logs();
  CommandResult out = run_command({dtrain, "logs", short_job}, o);
  EXPECT_TRUE(out.ok()) << out.output;
  EXPECT_NE(out.output.find("DONE step 5"), std::string::npos) << out.output;
  EXPECT_TRUE(std::filesystem::exists(logs + "/short.sbatch"));

  const std::string long_job = submit("long", 100000);
  ASSERT_FALSE(long_job.empty());
  CommandResult listed = run_command({dtrain, "jobs"}, o);
  EXPECT_TRUE(listed.ok()) << listed.output;
  EXPECT_TRUE(std::regex_search(listed.output,
                                std::regex(long_job + " +long +(PENDING|RUNNING|CONFIGURING)")))
      << listed.output;
  CommandResult cancelled = run_command({dtrain, "cancel", long_job}, o);
  EXPECT_TRUE(cancelled.ok()) << cancelled.output;
  EXPECT_EQ(state_of(long_job, std::chrono::seconds(60)), "CANCELLED");
  // The short job told of its start and of its end (a cancelled job's script is killed: no end).
  const std::string told = read_file(events);
  EXPECT_NE(told.find("short start 0"), std::string::npos) << told;
  EXPECT_NE(told.find("short end 0"), std::string::npos) << told;
  // Bad input is refused before anything is submitted.
  CommandResult bad = run_command({dtrain, "logs", "42; rm -rf /"}, o);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("is not a Slurm job id"), std::string::npos) << bad.output;
}

// `dtrain submit --gpus-per-proc G` under Slurm: each rank sees only its own G GPUs, numbered
// from 0, as under `dtrain run --gpus-per-proc` (the cluster's GPUs are stand-ins that Slurm
// allocates and binds as real ones); srun is told the CPUs per task again (since 22.05 it no
// longer takes them from the allocation).
TEST(SlurmTest, EachRankOfASubmittedJobSeesItsOwnGpus) {
  START_SLURM(cluster);
  if (!cluster.has_gpus()) GTEST_SKIP() << "no stand-in GPUs: mknod needs CAP_MKNOD";
  CommandOptions o;
  o.env = cluster.client_env();
  o.cwd = cluster.dir();
  const std::string logs = cluster.dir() + "/logs";
  CommandResult r = run_command(
      {kBin + "/dtrain", "submit", "--engine", "slurm", "--name", "gpus", "--procs-per-node", "2",
       "--gpus-per-proc", "2", "--cpus-per-proc", "2", "--not-preemptible", "--log-dir", logs, "--",
       "sh", "-c", "echo \"rank $SLURM_PROCID sees GPUs $CUDA_VISIBLE_DEVICES\""},
      o);
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex("submitted job (\\d+) to Slurm")))
      << r.output;
  const std::string id = m[1];
  std::string out;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < end &&
         (out.find("rank 0 sees") == std::string::npos ||
          out.find("rank 1 sees") == std::string::npos)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    out = read_file(logs + "/gpus-" + id + ".out");
  }
  EXPECT_NE(out.find("each rank sees its own 2 GPU(s), as CUDA devices 0 to 1"), std::string::npos)
      << out;
  // Each task sees two, not the four of the node, and not the other task's (CUDA numbers what it
  // sees from 0).
  std::regex seen("rank (\\d) sees GPUs ([0-9,]*)");
  std::map<std::string, std::string> gpus;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), seen); it != std::sregex_iterator();
       ++it) {
    gpus[(*it)[1]] = (*it)[2];
  }
  ASSERT_EQ(gpus.size(), 2u) << out << cluster.logs();
  for (const auto& [rank, list] : gpus)
    EXPECT_EQ(std::count(list.begin(), list.end(), ',') + 1, 2) << "rank " << rank << ": " << list;
  EXPECT_NE(gpus["0"], gpus["1"]) << out;
  // The CPUs per task said to srun (this test cluster binds no CPUs: the line is what to check).
  EXPECT_NE(read_file(logs + "/gpus.sbatch")
                .find("srun --kill-on-bad-exit=1 --cpus-per-task=2 --gpus-per-task=2 "
                      "--gpu-bind=per_task:2 sh -c"),
            std::string::npos);
}

// The script `dtrain submit` writes, preempted: SIGUSR1 to the tasks, the ranks save and exit 75,
// the script requeues the job and tells the notify command, and the requeued job resumes and ends.
TEST(SlurmTest, ASubmittedJobPreemptedIsRequeuedAndToldOf) {
  START_SLURM(cluster);
  CommandOptions o;
  o.env = cluster.client_env();
  o.env["DTRAIN_CONNECT_TIMEOUT"] = "60";
  o.cwd = cluster.dir();
  const std::string dir = cluster.dir() + "/work", events = cluster.dir() + "/events";
  std::filesystem::create_directories(dir);
  const int steps = 150;
  CommandResult r = run_command({kBin + "/dtrain",
                                 "submit",
                                 "--name",
                                 "pre",
                                 "--procs-per-node",
                                 "3",
                                 "--log-dir",
                                 cluster.dir(),
                                 "--max-restarts",
                                 "1",
                                 "--notify-command",
                                 "echo \"$DTRAIN_JOB_EVENT $DTRAIN_JOB_STATUS\" >> " + events,
                                 "--",
                                 kBin + "/preempt_worker",
                                 "--dir",
                                 dir,
                                 "--steps",
                                 std::to_string(steps),
                                 "--step-ms",
                                 "20"},
                                o);
  ASSERT_TRUE(r.ok()) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex("submitted job (\\d+)"))) << r.output;
  const std::string id = m[1];
  auto lines_of = [](const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (lines_of(dir + "/samples").size() < 10 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_GE(lines_of(dir + "/samples").size(), 10u) << cluster.logs();
  ASSERT_TRUE(run_command({"scancel", "--signal=USR1", id}, o).ok());
  std::string state;
  bool hurried = false;
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (state.empty() && std::chrono::steady_clock::now() < deadline) {
    CommandResult show = run_command({"scontrol", "-o", "show", "job", id}, o);
    if (!hurried && show.output.find("Reason=BeginTime") != std::string::npos)  // see above
      hurried = run_command({"scontrol", "update", "JobId=" + id, "StartTime=now"}, o).ok();
    if (std::regex_search(show.output, m, std::regex("JobState=(\\w+) .*?Restarts=(\\d+)")) &&
        (m[1] == "COMPLETED" || m[1] == "FAILED"))
      state = m[1].str() + " restarts " + m[2].str();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  const std::string job = read_file(cluster.dir() + "/pre-" + id + ".out");
  ASSERT_EQ(state, "COMPLETED restarts 1") << job << cluster.logs();
  EXPECT_EQ(read_file(events), "start 0\nrequeue 75\nstart 1\nend 0\n") << job;
  std::map<std::string, int> count;
  for (const auto& l : lines_of(dir + "/samples")) ++count[l];
  EXPECT_EQ(count.size(), static_cast<size_t>(steps));
  for (int s = 0; s < steps; ++s) EXPECT_EQ(count["sample " + std::to_string(s)], 1) << s;
}

// What `dtrain submit` asks of Slurm for GPUs, memory, packing, preemption and mail.
TEST(SubmitTest, TheSlurmScriptAsksForWhatTheJobNeeds) {
  CommandOptions o;
  o.env["PATH"] = "/nonexistent";  // no sinfo: auto placement packs, and says why
  CommandResult r = run_command({kBin + "/dtrain",
                                 "submit",
                                 "--dry-run",
                                 "--nodes",
                                 "2",
                                 "--procs-per-node",
                                 "8",
                                 "--gpus-per-proc",
                                 "1",
                                 "--gpu-model",
                                 "a100",
                                 "--mem",
                                 "512G",
                                 "--time",
                                 "1-00:00:00",
                                 "--constraint",
                                 "ib&a100",
                                 "--mail",
                                 "me@example.com",
                                 "--max-restarts",
                                 "5",
                                 "--",
                                 "python3",
                                 "train.py",
                                 "--name",
                                 "it's"},
                                o);
  ASSERT_TRUE(r.ok()) << r.output;
  for (const char* line :
       {"#SBATCH --nodes=2\n", "#SBATCH --ntasks-per-node=8\n", "#SBATCH --ntasks=16\n",
        "#SBATCH --gpus-per-task=a100:1\n", "#SBATCH --mem=512G\n", "#SBATCH --time=1-00:00:00\n",
        "#SBATCH --constraint='ib&a100'\n", "#SBATCH --switches=1@10:00\n",
        "#SBATCH --signal=USR1@90\n", "#SBATCH --requeue\n",
        "#SBATCH --mail-type=BEGIN,END,FAIL,REQUEUE\n", "placement pack (sinfo did not say",
        "\nsrun --gpus-per-task=1 --gpu-bind=per_task:1 python3 train.py --name 'it'\\''s'",
        "-lt 5 ]; then"})
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--nodes", "0"},
                                              {"--name", "Bad_Name"},
                                              {"--mem", "lots"},
                                              {"--gpu-model", "a100"},
                                              {"--placement", "random"},
                                              {"--stage-in", "nocolon"}}) {
    std::vector<std::string> argv{kBin + "/dtrain", "submit", "--dry-run"};
    argv.insert(argv.end(), bad.begin(), bad.end());
    argv.insert(argv.end(), {"--", "true"});
    CommandResult refused = run_command(argv, o);
    EXPECT_EQ(refused.exit_code, 2) << bad[0] << ": " << refused.output;
    EXPECT_NE(refused.output.find("dtrain submit: "), std::string::npos) << refused.output;
  }
}

// An srun step inside a bigger allocation (sbatch -N2, then srun -N1 -w node2): the step's own
// node list and task counts describe where its ranks run, not the job's.
TEST(SlurmIdentityTest, AStepOnPartOfTheAllocationUsesTheStepsNodes) {
  std::map<std::string, std::string> env = {{"SLURM_PROCID", "1"},
                                            {"SLURM_NTASKS", "2"},
                                            {"SLURM_LOCALID", "1"},
                                            {"SLURM_NODEID", "0"},
                                            {"SLURM_JOB_NODELIST", "node[1-2]"},
                                            {"SLURM_TASKS_PER_NODE", "4(x2)"},
                                            {"SLURM_STEP_NODELIST", "node2"},
                                            {"SLURM_STEP_TASKS_PER_NODE", "2"}};
  auto lookup = [&env](std::string_view name) -> std::optional<std::string> {
    auto it = env.find(std::string(name));
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  Identity id = resolve_identity({}, lookup);
  EXPECT_EQ(id.source, "slurm");
  EXPECT_EQ(id.master_addr, "node2");
  EXPECT_EQ(id.local_world_size, 2);
  EXPECT_EQ(id.node_rank, 0);
  // Without the step's variables (a step over the whole allocation, as older Slurm describes
  // it), the job's.
  env.erase("SLURM_STEP_NODELIST");
  env.erase("SLURM_STEP_TASKS_PER_NODE");
  env["SLURM_NTASKS"] = "8";
  id = resolve_identity({}, lookup);
  EXPECT_EQ(id.master_addr, "node1");
  EXPECT_EQ(id.local_world_size, 4);
  // Errors name the variable that was read.
  env["SLURM_STEP_TASKS_PER_NODE"] = "2(y1)";
  try {
    resolve_identity({}, lookup);
    ADD_FAILURE() << "a malformed SLURM_STEP_TASKS_PER_NODE was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_STEP_TASKS_PER_NODE is '2(y1)'"), std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Kubernetes

// Every document of a YAML file, through PyYAML (Debian: python3-yaml); null when it is missing.
std::optional<json> load_yaml(const std::string& path) {
  std::string python = testing::find_program("/usr/bin/python3");
  if (python.empty()) python = testing::find_program("python3");
  if (python.empty()) return std::nullopt;
  CommandResult r =
      run_command({python, "-c",
                   "import json, sys, yaml\n"
                   "json.dump(list(yaml.safe_load_all(open(sys.argv[1]))), sys.stdout)\n",
                   path});
  if (r.output.find("No module named 'yaml'") != std::string::npos) return std::nullopt;
  EXPECT_TRUE(r.ok()) << path << ": " << r.describe() << "\n" << r.output;
  if (!r.ok()) return json::array();
  return json::parse(r.output);
}

#define LOAD_YAML(var, path)                                                                  \
  auto var##_loaded = load_yaml(path);                                                        \
  if (!var##_loaded) GTEST_SKIP() << "python3 with PyYAML is missing (Debian: python3-yaml)"; \
  const json& var = *var##_loaded

const json& find_kind(const json& docs, const std::string& kind) {
  static const json kNull;
  for (const json& d : docs)
    if (d.is_object() && d.value("kind", "") == kind) return d;
  ADD_FAILURE() << "no " << kind << " in " << docs.dump().substr(0, 300);
  return kNull;
}

using Env = std::map<std::string, std::string>;

// A container's env list as a map. Only literal values: a valueFrom would need the API server.
Env env_of(const json& container) {
  Env env;
  for (const json& e : container.value("env", json::array())) {
    EXPECT_TRUE(e.contains("value")) << "env entry without a literal value: " << e;
    env[e["name"].get<std::string>()] = e.value("value", "");
  }
  return env;
}

Identity resolve(const Env& env) {
  return resolve_identity({}, [&env](std::string_view name) -> std::optional<std::string> {
    auto it = env.find(std::string(name));
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

// A misspelt DTRAIN_ variable in a manifest would be ignored silently: every one must be real.
void expect_known_variables(const Env& env) {
  std::set<std::string> known;
  for (const auto& v : env::all()) known.insert(std::string(v.name));
  for (const auto& [name, value] : env)
    EXPECT_TRUE(known.count(name)) << name << " is not in the table of src/common/env.h";
}

int port_named(const json& container, const std::string& name) {
  for (const json& p : container.value("ports", json::array()))
    if (p.value("name", "") == name) return p.value("containerPort", -1);
  return -1;
}

TEST(KubernetesTest, IndexedJobPodsFindTheirRanksAndPodZero) {
  LOAD_YAML(docs, kSource + "/deploy/k8s/indexed-job.yaml");
  const json& service = find_kind(docs, "Service");
  const json& job = find_kind(docs, "Job");
  ASSERT_FALSE(service.is_null() || job.is_null());

  // The headless Service gives pod i the name <job>-<i>.<subdomain> only if it selects the pods
  // and is the pods' subdomain.
  EXPECT_EQ(service["spec"]["clusterIP"], "None");
  const json& spec = job["spec"];
  EXPECT_EQ(spec["completionMode"], "Indexed");
  const int pods = spec["completions"].get<int>();
  EXPECT_EQ(spec["parallelism"], pods) << "every rank must run at once";
  const json& pod = spec["template"];
  EXPECT_EQ(pod["spec"]["subdomain"], service["metadata"]["name"]);
  for (const auto& [label, value] : service["spec"]["selector"].items())
    EXPECT_EQ(pod["metadata"]["labels"].value(label, ""), value) << label;
  ASSERT_EQ(pod["spec"]["containers"].size(), 1u);
  const json& container = pod["spec"]["containers"][0];
  const Env env = env_of(container);
  expect_known_variables(env);

  const std::string pod0 = fmt::format("{}-0.{}", job["metadata"]["name"].get<std::string>(),
                                       pod["spec"]["subdomain"].get<std::string>());
  const int store_port = service["spec"]["ports"][0]["port"].get<int>();
  EXPECT_EQ(port_named(container, "store"), store_port);
  for (int index = 0; index < pods; ++index) {
    Env pod_env = env;
    pod_env["JOB_COMPLETION_INDEX"] = std::to_string(index);  // what the Job controller adds
    Identity id = resolve(pod_env);
    EXPECT_EQ(id.source, "kubernetes");
    EXPECT_EQ(id.rank, index);
    EXPECT_EQ(id.world_size, pods) << "WORLD_SIZE must equal completions";
    EXPECT_EQ(id.master_addr, pod0);
    EXPECT_EQ(id.master_port, store_port);
    EXPECT_EQ(id.local_rank, 0);
    EXPECT_EQ(id.local_world_size, 1);
    EXPECT_EQ(id.node_rank, index);
  }
}

TEST(KubernetesTest, PyTorchJobPodsFindTheirRanksAndTheMaster) {
  LOAD_YAML(docs, kSource + "/deploy/k8s/pytorchjob.yaml");
  const json& job = find_kind(docs, "PyTorchJob");
  ASSERT_FALSE(job.is_null());
  const std::string name = job["metadata"]["name"];
  const json& replicas = job["spec"]["pytorchReplicaSpecs"];
  ASSERT_TRUE(replicas.contains("Master"));
  EXPECT_EQ(replicas["Master"]["replicas"], 1);
  int total = 0;
  for (const auto& [type, r] : replicas.items()) total += r["replicas"].get<int>();

  // What the training operator does (pkg/controller.v1/pytorch): MASTER_PORT is the master's
  // container port named pytorchjob-port in the container named pytorch; MASTER_ADDR is the
  // master pod's Service <job>-master-0; RANK is 0 for the master and 1 + i for worker i.
  int master_port = -1;
  for (const json& c : replicas["Master"]["template"]["spec"]["containers"])
    if (c.value("name", "") == "pytorch") master_port = port_named(c, "pytorchjob-port");
  ASSERT_GT(master_port, 0) << "the master needs a container 'pytorch' with a port named "
                               "'pytorchjob-port'";
  std::set<int> ranks;
  for (const auto& [type, r] : replicas.items()) {
    const json& containers = r["template"]["spec"]["containers"];
    ASSERT_EQ(containers.size(), 1u) << type;
    EXPECT_EQ(containers[0]["name"], "pytorch") << type;
    const Env env = env_of(containers[0]);
    expect_known_variables(env);
    for (int index = 0; index < r["replicas"].get<int>(); ++index) {
      Env pod_env = env;
      const int rank = type == "Master" ? index : index + 1;
      pod_env["MASTER_ADDR"] = name + "-master-0";
      pod_env["MASTER_PORT"] = std::to_string(master_port);
      pod_env["WORLD_SIZE"] = std::to_string(total);
      pod_env["RANK"] = std::to_string(rank);
      pod_env["PYTHONUNBUFFERED"] = "0";
      Identity id = resolve(pod_env);
      EXPECT_EQ(id.source, "torchrun");
      EXPECT_EQ(id.rank, rank);
      EXPECT_EQ(id.world_size, total);
      EXPECT_EQ(id.master_addr, name + "-master-0");
      EXPECT_EQ(id.master_port, master_port);
      ranks.insert(id.rank);
    }
  }
  EXPECT_EQ(ranks.size(), static_cast<size_t>(total));
}

TEST(KubernetesTest, TheImageHasWhatTheManifestsRun) {
  const std::string dockerfile = read_file(kSource + "/deploy/Dockerfile");
  ASSERT_FALSE(dockerfile.empty());
  EXPECT_NE(dockerfile.find("FROM debian:12"), std::string::npos);
  EXPECT_NE(dockerfile.find("scripts/install-deps.sh"), std::string::npos);
  for (const char* file : {"indexed-job.yaml", "pytorchjob.yaml"}) {
    LOAD_YAML(docs, kSource + "/deploy/k8s/" + file);
    std::vector<json> containers;
    for (const json& d : docs) {
      if (d.value("kind", "") == "Job")
        for (const json& c : d["spec"]["template"]["spec"]["containers"]) containers.push_back(c);
      if (d.value("kind", "") == "PyTorchJob")
        for (const auto& [type, r] : d["spec"]["pytorchReplicaSpecs"].items())
          for (const json& c : r["template"]["spec"]["containers"]) containers.push_back(c);
    }
    ASSERT_FALSE(containers.empty()) << file;
    for (const json& c : containers) {
      const std::string program = c["command"][0];
      ASSERT_TRUE(program.starts_with("/opt/dtrain/bin/")) << file << ": " << program;
      const std::string base = program.substr(program.rfind('/') + 1);
      EXPECT_NE(dockerfile.find("/tmp/build/bin/" + base), std::string::npos)
          << file << " runs " << program << ", which deploy/Dockerfile does not install";
      EXPECT_EQ(c["image"], "dtrain:latest") << file;
    }
  }
}

}  // namespace
}  // namespace dtrain
