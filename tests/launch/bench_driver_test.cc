// `dtrain bench` as a driver starts each implementation's processes with the launcher's
// supervisor: an implementation past --deadline is stopped and named, a failing rank stops the
// others and is named, and the result lines the ranks print never reach the user as text.
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "command.h"

namespace dtrain {
namespace {

using namespace dtrain::testing;
using namespace std::chrono_literals;

const std::string kDtrain = std::string(DTRAIN_BIN_DIR) + "/dtrain";

TEST(BenchDriver, AnImplementationPastItsDeadlineIsStoppedAndNamed) {
  CommandOptions o;
  o.timeout = 60s;
  const CommandResult r = run_command({kDtrain, "bench", "allreduce", "--np", "2", "--sizes", "64M",
                                       "--iters", "1000", "--deadline", "1"},
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
  const CommandResult r = run_command({kDtrain, "bench", "allreduce", "--np", "2", "--sizes", "4K",
                                       "--iters", "3", "--warmup", "1"},
                                      o);
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  EXPECT_EQ(r.output.find("{\"impl\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("# allreduce  np 2"), std::string::npos) << r.output;
}

// --bound: the machine's limits are measured and said first, and every dtrain row gets its
// fraction of them, in the table and in the JSON lines: above 0, and not far above 1 (the bound
// is what the machine's memory and sockets allow: a measurement beats it only by what the
// model's formula leaves out).
TEST(BenchDriver, TheBoundIsMeasuredAndEachRowShowsItsFractionOfIt) {
  CommandOptions o;
  o.timeout = 120s;
  const std::string json = ::testing::TempDir() + "/bench_bound.jsonl";
  const CommandResult r =
      run_command({kDtrain, "bench", "allreduce", "--np", "2", "--sizes", "8,1M", "--iters", "20",
                   "--warmup", "2", "--bound", "--json", json},
                  o);
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  EXPECT_NE(r.output.find("this machine allows: memcpy"), std::string::npos) << r.output;
  // One loopback stream, and as many at once as the machine has CPUs: the flows' share.
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex("a loopback TCP stream [0-9.]+ GB/s, [0-9.]+ GB/s \\([0-9]+ at once\\)")))
      << r.output;
  EXPECT_NE(r.output.find(" bound"), std::string::npos) << r.output;
  std::smatch m;
  std::ifstream in(json);
  const std::string lines((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int rows = 0;
  for (auto it = lines.cbegin();
       std::regex_search(it, lines.cend(), m, std::regex("\"bound_fraction\":([0-9.eE+-]+)"));
       it = m.suffix().first) {
    const double f = std::stod(m[1]);
    EXPECT_GT(f, 0.0) << lines;
    EXPECT_LT(f, 3.0) << lines;
    ++rows;
  }
  EXPECT_EQ(rows, 2) << lines;
}

}  // namespace
}  // namespace dtrain
