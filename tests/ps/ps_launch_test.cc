// `dtrain run --servers S -n N`: servers and workers started together, a real training run, and a
// server killed mid-run failing the whole job fast.
#include <gtest/gtest.h>
#include <signal.h>

#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "launch/launched.h"
#include "support/multiproc.h"

namespace dtrain::testing {
namespace {

const std::string kCtr = std::string(DTRAIN_BIN_DIR) + "/ctr_sparse";

// A process started with extra environment variables, its output in a file.
class Proc {
 public:
  Proc(std::vector<std::string> argv, std::vector<std::pair<std::string, std::string>> env)
      : log_(::testing::TempDir() + "ps_proc_" + std::to_string(::getpid()) + "_" +
             std::to_string(counter_++) + ".log") {
    pid_ = ::fork();
    if (pid_ == 0) {
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      FILE* f = std::fopen(log_.c_str(), "w");
      ::dup2(fileno(f), 1);
      ::dup2(fileno(f), 2);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
  }
  ~Proc() {
    if (!done_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::remove(log_.c_str());
  }
  // The exit code, or -1 when it did not end within `limit`.
  int wait(std::chrono::seconds limit) {
    auto end = std::chrono::steady_clock::now() + limit;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > end) return -1;
      std::this_thread::sleep_for(milliseconds(20));
    }
    done_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string output() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  static inline int counter_ = 0;
  std::string log_;
  pid_t pid_ = -1;
  bool done_ = false;
};

void expect_job_trains(std::vector<std::unique_ptr<Proc>>& servers,
                       std::vector<std::unique_ptr<Proc>>& workers) {
  bool result_seen = false;
  for (auto& w : workers) {
    EXPECT_EQ(w->wait(seconds(60)), 0) << w->output();
    result_seen = result_seen || w->output().find("RESULT ") != std::string::npos;
  }
  EXPECT_TRUE(result_seen) << "worker 0 printed no RESULT";
  for (auto& s : servers) EXPECT_EQ(s->wait(seconds(20)), 0) << s->output();
}

// ps-lite / BytePS variables: a scheduler hosts the store, indexes are handed out by arrival.
TEST(PsLaunchTest, PsLiteVariablesLaunchUnchanged) {
  const std::string port = std::to_string(free_port());
  auto dmlc = [&](const char* role) {
    return std::vector<std::pair<std::string, std::string>>{
        {"DMLC_ROLE", role},           {"DMLC_NUM_SERVER", "2"},
        {"DMLC_NUM_WORKER", "2"},      {"DMLC_PS_ROOT_URI", "127.0.0.1"},
        {"DMLC_PS_ROOT_PORT", port}};
  };
  std::vector<std::unique_ptr<Proc>> servers, workers;
  servers.push_back(std::make_unique<Proc>(std::vector<std::string>{kDtrain, "ps-server"},
                                           dmlc("scheduler")));
  for (int i = 0; i < 2; ++i)
    servers.push_back(
        std::make_unique<Proc>(std::vector<std::string>{kDtrain, "ps-server"}, dmlc("server")));
  for (int i = 0; i < 2; ++i)
    workers.push_back(std::make_unique<Proc>(
        std::vector<std::string>{kCtr, "--steps", "100", "--eval", "1000"}, dmlc("worker")));
  expect_job_trains(servers, workers);
}

// TensorFlow's TF_CONFIG: the servers listen on the ports the cluster lists; no store at all.
TEST(PsLaunchTest, TfConfigLaunchesUnchanged) {
  const std::string p0 = std::to_string(free_port()), p1 = std::to_string(free_port());
  const std::string cluster = R"({"cluster": {"ps": ["127.0.0.1:)" + p0 + R"(", "127.0.0.1:)" + p1 +
                              R"("], "chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}, )";
  auto task = [&](const char* type, int index) {
    return std::vector<std::pair<std::string, std::string>>{
        {"TF_CONFIG", cluster + R"("task": {"type": ")" + type + R"(", "index": )" +
                          std::to_string(index) + "}}"}};
  };
  std::vector<std::unique_ptr<Proc>> servers, workers;
  for (int i = 0; i < 2; ++i)
    servers.push_back(
        std::make_unique<Proc>(std::vector<std::string>{kDtrain, "ps-server"}, task("ps", i)));
  workers.push_back(std::make_unique<Proc>(
      std::vector<std::string>{kCtr, "--steps", "100", "--eval", "1000"}, task("chief", 0)));
  workers.push_back(std::make_unique<Proc>(
      std::vector<std::string>{kCtr, "--steps", "100", "--eval", "1000"}, task("worker", 0)));
  expect_job_trains(servers, workers);
}

TEST(PsLaunchTest, ServersAndWorkersTrainTheSparseModel) {
  Launched run({"run", "--servers", "2", "-n", "2", "--", kCtr, "--steps", "300", "--eval",
                "5000"});
  auto code = run.wait(seconds(90));
  ASSERT_TRUE(code.has_value()) << run.out() << run.err();
  ASSERT_EQ(*code, 0) << run.out() << run.err();
  EXPECT_NE(run.err().find("[server 1]"), std::string::npos) << run.err();
  auto at = run.out().find("RESULT ");
  ASSERT_NE(at, std::string::npos) << run.out();
  auto result = nlohmann::json::parse(run.out().substr(at + 7, run.out().find('\n', at) - at - 7));
  EXPECT_EQ(result["servers"], 2);
  // Learned something real: well below the constant predictor's loss.
  EXPECT_LT(result["test_logloss"].get<double>(), result["constant_logloss"].get<double>() - 0.03)
      << result.dump();
}

TEST(PsLaunchTest, AKilledServerFailsTheJobFast) {
  Launched run({"run", "--servers", "1", "-n", "2", "--", kCtr, "--steps", "1000000"});
  std::smatch m;
  const std::regex serving(R"(ps server 0 \([0-9.:]+\): serving \(pid (\d+)\))");
  ASSERT_TRUE(run.read_until([&] { return std::regex_search(run.err(), m, serving); },
                             Deadline::after(seconds(30))))
      << run.err();
  const pid_t pid = std::stoi(m[1]);
  run.pump(milliseconds(500));  // training is under way
  ::kill(pid, SIGKILL);
  auto start = std::chrono::steady_clock::now();
  auto code = run.wait(seconds(20));
  ASSERT_TRUE(code.has_value()) << run.err();
  EXPECT_NE(*code, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(5));
  // Whichever the launcher notices first, the server's death or a worker failing on it, the
  // summary names server 0.
  const bool server_named =
      run.err().find("server 0 (pid " + std::to_string(pid) + ") was killed by SIGKILL") !=
          std::string::npos ||
      std::regex_search(run.err(), std::regex(R"(dtrain run: rank \d[\s\S]*ps server 0 at [0-9.:]+ is gone)"));
  EXPECT_TRUE(server_named) << run.err();
}

}  // namespace
}  // namespace dtrain::testing
