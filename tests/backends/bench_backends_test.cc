// `dtrain bench --backend native,gloo`: one run times dtrain's group over each backend, checks
// the results, and shows the second backend as a column beside the first. With --rounds, the
// table shows each implementation's median over the rounds and the median of the rounds' ratios.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace {

// Runs `command` through the shell; its exit status, stdout and stderr in `out`.
int run(const std::string& command, std::string& out) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::vector<nlohmann::json> read_json_lines(const std::string& path) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

const std::string kDtrain = std::string(DTRAIN_BIN_DIR) + "/dtrain";

TEST(BenchCommand, ComparesBackendsInOneRun) {
  const std::string json = ::testing::TempDir() + "bench_backends.jsonl";
  std::remove(json.c_str());
  std::string out;
  ASSERT_EQ(run(kDtrain + " bench allreduce --np 2 --sizes 4K,64K --iters 3 --warmup 1 --check "
                          "--backend native,gloo --json " + json,
                out),
            0)
      << out;
  EXPECT_NE(out.find("dtrain-gloo:ratio"), std::string::npos) << out;
  std::map<std::string, int> rows;
  for (const auto& j : read_json_lines(json)) {
    EXPECT_EQ(j["wrong"], 0) << j;
    EXPECT_GT(j["time_us"].get<double>(), 0.0) << j;
    EXPECT_FALSE(j.contains("round")) << j;
    rows[j["impl"].get<std::string>()]++;
  }
  EXPECT_EQ(rows["dtrain"], 2);
  EXPECT_EQ(rows["dtrain-gloo"], 2);
  std::remove(json.c_str());
}

TEST(BenchCommand, RoundsShowTheMediansOfTheirTimesAndRatios) {
  const std::string json = ::testing::TempDir() + "bench_rounds.jsonl";
  std::remove(json.c_str());
  std::string out;
  ASSERT_EQ(run(kDtrain + " bench allreduce --np 2 --sizes 4K --iters 3 --warmup 1 --rounds 3 "
                          "--backend native,gloo --json " + json,
                out),
            0)
      << out;
  EXPECT_NE(out.find("the median of 3 rounds"), std::string::npos) << out;
  // One line per implementation and round, the rounds numbered 1..3 in the order they ran.
  std::map<std::string, std::map<int, double>> time;  // impl -> round -> us
  for (const auto& j : read_json_lines(json)) {
    EXPECT_EQ(j["wrong"], 0) << j;
    time[j["impl"].get<std::string>()][j["round"].get<int>()] = j["time_us"].get<double>();
  }
  ASSERT_EQ(time["dtrain"].size(), 3u) << out;
  ASSERT_EQ(time["dtrain-gloo"].size(), 3u) << out;
  std::vector<double> ours, theirs, ratios;
  for (int round = 1; round <= 3; ++round) {
    ASSERT_TRUE(time["dtrain"].count(round) && time["dtrain-gloo"].count(round)) << out;
    ours.push_back(time["dtrain"][round]);
    theirs.push_back(time["dtrain-gloo"][round]);
    ratios.push_back(theirs.back() / ours.back());
  }
  // The table's row: time, p99, algbw, busbw, #wrong, algo, rounds(us), ratio, [range], theirs.
  std::istringstream table(out);
  std::string row;
  for (std::string line; std::getline(table, line);)
    if (line.find(" 4096 ") != std::string::npos && line.find("f32") != std::string::npos) row = line;
  ASSERT_FALSE(row.empty()) << out;
  std::istringstream fields(row);
  std::string size, count, type, op, t, p99, algbw, busbw, wrong, algo, range, ratio, ratio_range,
      their_time;
  fields >> size >> count >> type >> op >> t >> p99 >> algbw >> busbw >> wrong >> algo >> range >>
      ratio >> ratio_range >> their_time;
  EXPECT_EQ(t, fmt::format("{:.1f}", median(ours))) << row;
  EXPECT_EQ(their_time, fmt::format("{:.1f}", median(theirs))) << row;
  EXPECT_EQ(ratio, fmt::format("{:.2f}", median(ratios))) << row;
  EXPECT_EQ(ratio_range, fmt::format("[{:.2f}-{:.2f}]", *std::min_element(ratios.begin(), ratios.end()),
                                     *std::max_element(ratios.begin(), ratios.end())))
      << row;
  EXPECT_EQ(range, fmt::format("{:.1f}-{:.1f}", *std::min_element(ours.begin(), ours.end()),
                               *std::max_element(ours.begin(), ours.end())))
      << row;
  std::remove(json.c_str());
}

TEST(BenchCommand, NoRoundsIsRefused) {
  std::string out;
  EXPECT_NE(run(kDtrain + " bench allreduce --np 2 --rounds 0", out), 0) << out;
  EXPECT_NE(out.find("--rounds 0: run at least one round"), std::string::npos) << out;
}

}  // namespace
