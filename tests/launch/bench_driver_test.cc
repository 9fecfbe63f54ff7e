// `dtrain bench` as a driver starts each implementation's processes with the launcher's
// supervisor: an implementation past --deadline is stopped and named, a failing rank stops the
// others and is named, and the result lines the ranks print never reach the user as text.
#include <gtest/gtest.h>

#include <string>

#include "command.h"

namespace dtrain {
namespace {

using namespace dtrain::testing;
using namespace std::chrono_literals;

const std::string kDtrain = std::string(DTRAIN_BIN_DIR) + "/dtrain";

TEST(BenchDriver, AnImplementationPastItsDeadlineIsStoppedAndNamed) {
  CommandOptions o;
  o.timeout = 60s;
  const CommandResult r = run_command(
      {kDtrain, "bench", "allreduce", "--np", "2", "--sizes", "64M", "--iters", "1000",
       "--deadline", "1"},
      o);
  EXPECT_EQ(r.exit_code, 1) << r.describe() << "\n" << r.output;
  EXPECT_NE(r.output.find("dtrain: did not finish within the deadline (1 s, --deadline); stopped"),
            std::string::npos)
      << r.output;
  // Stopped at the deadline (SIGTERM, SIGKILL after the grace period), not run to the end.
  EXPECT_LT(r.seconds, 15) << r.output;
}

TEST(BenchDriver, AFailingRankIsNamedAndTheOthersAreStopped) {
  CommandOptions o;
  o.timeout = 60s;
  // The last rank comes 300 ms late to every collective; the others give up after 50 ms.
  const CommandResult r =
      run_command({kDtrain, "bench", "allreduce", "--np", "2", "--sizes", "4K", "--iters", "3",
                   "--warmup", "0", "--straggle-ms", "300", "--timeout", "0.05"},
                  o);
  EXPECT_EQ(r.exit_code, 1) << r.describe() << "\n" << r.output;
  EXPECT_NE(r.output.find("failed with exit code"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(its error is above); stopped the others"), std::string::npos)
      << r.output;
  // The rank's own error came through, labelled with the implementation and the rank.
  EXPECT_NE(r.output.find("[dtrain rank "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("timed out after"), std::string::npos) << r.output;
}

TEST(BenchDriver, ResultLinesAreTakenAndTheTableShowsThem) {
  CommandOptions o;
  o.timeout = 60s;
  const CommandResult r = run_command(
      {kDtrain, "bench", "allreduce", "--np", "2", "--sizes", "4K", "--iters", "3", "--warmup",
       "1"},
      o);
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  EXPECT_EQ(r.output.find("{\"impl\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("# allreduce  np 2"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dtrain
