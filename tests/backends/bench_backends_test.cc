// `dtrain bench --backend native,gloo`: one run times dtrain's group over each backend, checks
// the results, and shows the second backend as a column beside the first.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace {

TEST(BenchCommand, ComparesBackendsInOneRun) {
  const std::string json = ::testing::TempDir() + "bench_backends.jsonl";
  std::remove(json.c_str());
  const std::string command = std::string(DTRAIN_BIN_DIR) +
                              "/dtrain bench allreduce --np 2 --sizes 4K,64K --iters 3 --warmup 1 "
                              "--check --backend native,gloo --json " + json + " 2>&1";
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096];
  while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
  ASSERT_EQ(pclose(p), 0) << out;
  EXPECT_NE(out.find("dtrain-gloo:ratio"), std::string::npos) << out;
  std::ifstream in(json);
  std::map<std::string, int> rows;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["wrong"], 0) << line;
    EXPECT_GT(j["time_us"].get<double>(), 0.0) << line;
    rows[j["impl"].get<std::string>()]++;
  }
  EXPECT_EQ(rows["dtrain"], 2);
  EXPECT_EQ(rows["dtrain-gloo"], 2);
  std::remove(json.c_str());
}

}  // namespace
