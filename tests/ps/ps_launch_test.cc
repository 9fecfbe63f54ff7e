// `dtrain run --servers S -n N`: servers and workers started together, a real training run, and a
// server killed mid-run failing the whole job fast.
#include <gtest/gtest.h>
#include <signal.h>

#include <regex>

#include <nlohmann/json.hpp>

#include "launch/launched.h"

namespace dtrain::testing {
namespace {

const std::string kCtr = std::string(DTRAIN_BIN_DIR) + "/ctr_sparse";

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
