// `dtrain submit` beyond Slurm (engines_test.cc has the throwaway Slurm): the Kubernetes
// manifests parsed and each pod's script run here as its pod would run it, this machine's queue
// (order, resources, notifications, requeue on 75, cancel), a YAML job file, --mem auto measured
// by a probe run, and a 2-container job on podman when an image is given (DTRAIN_TEST_IMAGE,
// scripts/container-test.sh builds one).
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "launch/command.h"
#include "support/multiproc.h"
#include "support/temp_dir.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

const std::string kBin = DTRAIN_BIN_DIR;
const std::string kSource = DTRAIN_SOURCE_DIR;
const std::string kDtrain = kBin + "/dtrain";
const std::string kWorker = kBin + "/progress_worker";

std::string read(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every YAML document of `text`, through PyYAML. (The tests copy what they look into: a
// missing key read through a const json& is undefined behaviour, not a failure.)
json yaml_documents(const std::string& text, const std::string& dir) {
  const std::string path = dir + "/manifests.yaml";
  std::ofstream(path) << text;
  CommandResult r =
      run_command({"/usr/bin/python3", "-c",
                   "import json, sys, yaml\njson.dump(list(yaml.safe_load_all(open(sys.argv[1]))), "
                   "sys.stdout)\n",
                   path});
  EXPECT_TRUE(r.ok()) << r.describe() << r.output;
  return r.ok() ? json::parse(r.output) : json::array();
}

const json& kind(const json& docs, const std::string& k) {
  static const json kNull;
  for (const json& d : docs)
    if (d.value("kind", "") == k) return d;
  ADD_FAILURE() << "no " << k;
  return kNull;
}

TEST(K8sSubmit, TheManifestsAskForTheGpusAndEachPodRunsItsNodeOfTheJob) {
  TempDir dir;
  CommandResult r = run_command({kDtrain,
                                 "submit",
                                 "--engine",
                                 "k8s",
                                 "--dry-run",
                                 "--name",
                                 "t1",
                                 "--nodes",
                                 "2",
                                 "--procs-per-node",
                                 "2",
                                 "--gpus-per-proc",
                                 "2",
                                 "--gpu-model",
                                 "NVIDIA-A100-SXM4-80GB",
                                 "--mem",
                                 "64G",
                                 "--time",
                                 "1-02:00:00",
                                 "--container",
                                 "localhost/dtrain:latest",
                                 "--partition",
                                 "team-a",
                                 "--notify-command",
                                 "echo \"$DTRAIN_JOB_EVENT\" >> " + dir.path + "/events",
                                 "--",
                                 kWorker,
                                 "--steps",
                                 "30",
                                 "--slow-ms",
                                 "0"});
  ASSERT_TRUE(r.ok()) << r.output;
  json docs = yaml_documents(r.output, dir.path);
  json service = kind(docs, "Service");
  json job = kind(docs, "Job");
  ASSERT_FALSE(service.is_null() || job.is_null());
  EXPECT_EQ(service["spec"]["clusterIP"], "None");
  EXPECT_EQ(job["spec"]["completionMode"], "Indexed");
  EXPECT_EQ(job["spec"]["completions"], 2);
  EXPECT_EQ(job["spec"]["parallelism"], 2);
  EXPECT_EQ(job["spec"]["activeDeadlineSeconds"], 93600);
  EXPECT_EQ(job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "team-a");
  // Any failure but 75 fails the Job; 75 (saved for a requeue) counts, up to --max-restarts
  // (3 by default) requeues of both pods; evictions never count.
  json rules = job["spec"]["podFailurePolicy"]["rules"];
  EXPECT_EQ(rules[0]["action"], "FailJob");
  EXPECT_EQ(rules[0]["onExitCodes"]["operator"], "NotIn");
  EXPECT_EQ(rules[0]["onExitCodes"]["values"][0], 75);
  EXPECT_EQ(rules[1]["action"], "Count");
  EXPECT_EQ(rules[2]["onPodConditions"][0]["type"], "DisruptionTarget");
  EXPECT_EQ(job["spec"]["backoffLimit"], 6);
  EXPECT_EQ(service["metadata"]["labels"].count("kueue.x-k8s.io/queue-name"), 0u)
      << "the queue label belongs on the Job only";
  json pod = job["spec"]["template"];
  EXPECT_EQ(pod["metadata"]["labels"].count("kueue.x-k8s.io/queue-name"), 0u);
  EXPECT_EQ(pod["spec"]["subdomain"], "t1");
  for (const auto& [k, v] : service["spec"]["selector"].items())
    EXPECT_EQ(pod["metadata"]["labels"][k], v);
  EXPECT_EQ(pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-80GB");
  json c = pod["spec"]["containers"][0];
  EXPECT_EQ(c["image"], "localhost/dtrain:latest");
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"], 4);
  EXPECT_EQ(c["resources"]["limits"]["memory"], "64Gi");
  std::map<std::string, std::string> env;
  for (json e : c["env"]) env[e["name"]] = e["value"];
  EXPECT_EQ(env["MASTER_ADDR"], "t1-0.t1");
  EXPECT_EQ(env["MASTER_PORT"], "29500");
  EXPECT_EQ(service["spec"]["ports"][0]["port"], 29500);

  // Each pod's script, run here as the Job controller would start it (JOB_COMPLETION_INDEX),
  // with pod 0's name standing for this machine and a recorded DGX-1 for nvidia-smi.
  ASSERT_EQ(c["command"][0], "/bin/bash");
  const std::string script = c["command"][2];
  std::vector<std::unique_ptr<std::thread>> pods;
  std::vector<CommandResult> results(2);
  const std::string port = std::to_string(free_port());
  for (int index = 0; index < 2; ++index) {
    pods.push_back(std::make_unique<std::thread>([&, index] {
      std::map<std::string, std::optional<std::string>> e(env.begin(), env.end());
      e["JOB_COMPLETION_INDEX"] = std::to_string(index);
      e["MASTER_ADDR"] = "127.0.0.1";
      e["MASTER_PORT"] = port;
      e["PATH"] = kBin + ":" + std::getenv("PATH");
      e["DTRAIN_GPU_TOPOLOGY"] = kSource + "/tests/launch/topologies/dgx1_v100.txt";
      results[index] = run_command({"/bin/bash", "-c", script}, {.env = e, .timeout = seconds(90)});
    }));
  }
  for (auto& t : pods) t->join();
  for (int index = 0; index < 2; ++index)
    EXPECT_TRUE(results[index].ok()) << "pod " << index << ": " << results[index].output;
  EXPECT_NE(results[0].output.find("DONE step 30"), std::string::npos) << results[0].output;
  // Rank 0's 30 all-reduces needed all 4 ranks: 2 per pod, each with 2 GPUs NVLinked together.
  for (int index = 0; index < 2; ++index)
    EXPECT_NE(results[index].output.find("local rank 1: GPUs 1,2 (NV2)"), std::string::npos)
        << results[index].output;
  EXPECT_EQ(read(dir.path + "/events"), "start\nend\n");  // from pod 0 only
}

TEST(K8sSubmit, PackVolcanoAndWhatKubernetesCannotDo) {
  CommandResult r = run_command({kDtrain, "submit", "--engine", "k8s", "--dry-run", "--nodes", "3",
                                 "--placement", "pack", "--volcano", "--topology-key",
                                 "example.com/rack", "--container", "img", "--", "true"});
  ASSERT_TRUE(r.ok()) << r.output;
  TempDir dir;
  json docs = yaml_documents(r.output, dir.path);
  json pod = kind(docs, "Job")["spec"]["template"];
  json term =
      pod["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
  EXPECT_EQ(term["podAffinityTerm"]["topologyKey"], "example.com/rack");
  EXPECT_EQ(pod["spec"]["schedulerName"], "volcano");
  EXPECT_EQ(kind(docs, "PodGroup")["spec"]["minMember"], 3);

  r = run_command({kDtrain, "submit", "--engine", "k8s", "--dry-run", "--", "true"});
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.output.find("give --container IMAGE"), std::string::npos) << r.output;
  r = run_command({kDtrain, "submit", "--engine", "k8s", "--dry-run", "--container", "i", "--mail",
                   "a@b.c", "--", "true"});
  EXPECT_NE(r.output.find("Kubernetes sends no mail"), std::string::npos) << r.output;
}

// The local queue, in a directory of the test's own.
class LocalQueue : public ::testing::Test {
 protected:
  CommandResult dtrain(std::vector<std::string> args, seconds timeout = seconds(60)) {
    args.insert(args.begin(), kDtrain);
    return run_command(
        args, {.env = {{"DTRAIN_QUEUE_DIR", queue_.path}}, .timeout = timeout, .cwd = work_.path});
  }
  std::string submit(std::vector<std::string> args) {
    args.insert(args.begin(),
                {"submit", "--engine", "local", "--log-dir", work_.path, "--notify-command",
                 "echo \"$DTRAIN_JOB_ID $DTRAIN_JOB_EVENT $DTRAIN_JOB_STATUS\" >> " + work_.path +
                     "/events"});
    CommandResult r = dtrain(args);
    EXPECT_TRUE(r.ok()) << r.output;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(r.output, m, std::regex("submitted job (\\d+)"))) << r.output;
    return m[1];
  }
  std::string state(const std::string& id) {
    std::string s = read(queue_.path + "/" + id + "/state");
    return s.substr(0, s.find('\n'));
  }
  // Waits until the job is in `want` (at most 90 s).
  void wait_for(const std::string& id, const std::string& want) {
    for (int i = 0; i < 900 && state(id) != want; ++i)
      std::this_thread::sleep_for(milliseconds(100));
    ASSERT_EQ(state(id), want) << "job " << id << "\n"
                               << dtrain({"logs", "--engine", "local", id}).output;
  }
  std::string events() { return read(work_.path + "/events"); }
  TempDir queue_, work_;
};

TEST_F(LocalQueue, JobsRunInOrderAsTheCpusAllowAndTellTheirEvents) {
  // Two jobs of as many ranks as the machine has CPUs (at least 2): the second waits.
  const std::string n = std::to_string(std::max(2u, std::thread::hardware_concurrency()));
  const std::string a =
      submit({"--procs-per-node", n, "--", kWorker, "--steps", "20", "--slow-ms", "0"});
  const std::string b = submit({"--name", "second", "--procs-per-node", n, "--", kWorker, "--steps",
                                "10", "--slow-ms", "0"});
  wait_for(a, "succeeded");
  wait_for(b, "succeeded");
  EXPECT_EQ(events(), a + " start 0\n" + a + " end 0\n" + b + " start 0\n" + b + " end 0\n");
  const CommandResult jobs = dtrain({"jobs", "--engine", "local"});
  EXPECT_NE(jobs.output.find("second"), std::string::npos) << jobs.output;
  EXPECT_NE(jobs.output.find("succeeded (0)"), std::string::npos) << jobs.output;
  EXPECT_NE(dtrain({"logs", "--engine", "local", b}).output.find("DONE step 10"),
            std::string::npos);
}

TEST_F(LocalQueue, AJobThatSavedForARequeueRunsAgainAndACancelledOneStops) {
  // Exits 75 (as dtrain::Preemption::requeue() does) the first time, succeeds the second.
  const std::string marker = work_.path + "/first-run-done";
  const std::string a = submit(
      {"--max-restarts", "2", "--", "/bin/sh", "-c",
       "if [ -e " + marker + " ]; then echo second run; else touch " + marker + "; exit 75; fi"});
  wait_for(a, "succeeded");
  EXPECT_EQ(read(queue_.path + "/" + a + "/restarts"), "1\n");
  EXPECT_EQ(events(), a + " start 0\n" + a + " requeue 75\n" + a + " start 1\n" + a + " end 0\n");
  EXPECT_NE(dtrain({"logs", "--engine", "local", a}).output.find("second run"), std::string::npos);

  const std::string b = submit({"--", kWorker, "--steps", "100000", "--slow-ms", "0"});
  wait_for(b, "running");
  const CommandResult c = dtrain({"cancel", "--engine", "local", b});
  EXPECT_NE(c.output.find("stopping job " + b), std::string::npos) << c.output;
  wait_for(b, "cancelled");
  EXPECT_EQ(run_command({"pgrep", "-f", "progress_worker --steps 100000"}).exit_code, 1)
      << "a rank of the cancelled job is still running";
  EXPECT_FALSE(dtrain({"cancel", "--engine", "local", "999"}).ok());
}

TEST(JobFile, KeysAreTheFlagsAndAFlagGivenWins) {
  TempDir dir;
  const std::string file = dir.path + "/job.yaml";
  std::ofstream(file) << "name: from-file\nengine: slurm\nnodes: 3\nprocs-per-node: 4\n"
                         "gpus-per-proc: 1\ngpu-model: h100\nenv: {A: b}\n"
                         "command: [./train, --epochs, \"2\"]\n";
  CommandResult r = run_command(
      {kDtrain, "submit", "--file", file, "--dry-run", "--placement", "pack", "--nodes", "2"});
  ASSERT_TRUE(r.ok()) << r.output;
  for (const char* want :
       {"#SBATCH --job-name=from-file", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4",
        "#SBATCH --ntasks=8", "#SBATCH --gpus-per-task=h100:1", "export A=b", "./train --epochs 2"})
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;

  std::ofstream(file) << "name: x\nnodes: 2\nprocs_per_node: 4\n";
  r = run_command({kDtrain, "submit", "--file", file, "--dry-run", "--", "true"});
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.output.find(file + ":3: unknown key 'procs_per_node'"), std::string::npos)
      << r.output;
  std::ofstream(file) << "nodes: many\n";
  r = run_command({kDtrain, "submit", "--file", file, "--dry-run", "--", "true"});
  EXPECT_NE(r.output.find(file + ":1: 'nodes' has a value of the wrong kind (a whole number"),
            std::string::npos)
      << r.output;
}

TEST(MemAuto, AProbeRunMeasuresWhatEachNodeNeeds) {
  // Two ranks, each holding 200 MiB it has written: 2 x (200 + the interpreter) x 1.25.
  CommandResult r = run_command(
      {kDtrain, "submit", "--dry-run", "--procs-per-node", "2", "--mem", "auto", "--",
       "/usr/bin/python3", "-c", "import time; x = b'\\x01' * (200 << 20); time.sleep(1)"},
      {.timeout = seconds(60)});
  ASSERT_TRUE(r.ok()) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex("#SBATCH --mem=(\\d+)M"))) << r.output;
  const int mib = std::stoi(m[1]);
  EXPECT_GE(mib, 500) << r.output;
  EXPECT_LE(mib, 700) << r.output;
  EXPECT_NE(r.output.find("peaked at"), std::string::npos) << r.output;

  r = run_command({kDtrain, "submit", "--dry-run", "--mem", "auto", "--", "/bin/sh", "-c",
                   "echo broken >&2; exit 4"});
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.output.find("the probe run of the command failed (exit 4)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("broken"), std::string::npos) << r.output;
}

// Two containers of the image, one node of the job each, on the host's network: a real
// training run of train_fashion_mnist through the local queue. scripts/container-test.sh builds
// the image and sets DTRAIN_TEST_IMAGE.
TEST_F(LocalQueue, ATwoContainerTrainingJobOnPodman) {
  const char* image = std::getenv("DTRAIN_TEST_IMAGE");
  if (image == nullptr || *image == '\0')
    GTEST_SKIP() << "DTRAIN_TEST_IMAGE is not set: scripts/container-test.sh builds the image "
                    "(podman) and runs this test";
  const std::string a = submit({"--container", image, "--nodes", "2", "--procs-per-node", "1", "--",
                                "train_fashion_mnist", "--max-steps", "60", "--threads", "1"});
  for (int i = 0; i < 3000 && state(a) != "succeeded" && state(a) != "failed"; ++i)
    std::this_thread::sleep_for(milliseconds(100));
  const std::string log = dtrain({"logs", "--engine", "local", a}).output;
  ASSERT_EQ(state(a), "succeeded") << log;
  EXPECT_NE(log.find("RESULT"), std::string::npos) << log;
  EXPECT_NE(log.find("\"world_size\":2"), std::string::npos) << log;
}

}  // namespace
}  // namespace dtrain::testing
