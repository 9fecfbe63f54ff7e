// `dtrain run --metrics-port`: the workers' progress (dtrain::ProgressReporter) and the
// launcher's restarts, scraped over HTTP as Prometheus text while the job runs, with values that
// follow from what the workers do (progress_worker.cc: rank 1 computes 30 ms longer each step, so
// rank 0 waits about that long in the all-reduce).
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <map>
#include <regex>
#include <sstream>

#include "launch/launched.h"

namespace dtrain::testing {
namespace {

const std::string kWorker = std::string(DTRAIN_BIN_DIR) + "/progress_worker";

// GET /metrics from 127.0.0.1:port: the body.
std::string scrape(int port) {
  const auto deadline = Deadline::after(seconds(5));
  auto fd = net::connect_tcp({"127.0.0.1", static_cast<uint16_t>(port)}, deadline, "scrape");
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
  net::write_all(fd.get(), request.data(), request.size(), deadline, "scrape");
  std::string response;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
    if (n <= 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  const auto body = response.find("\r\n\r\n");
  EXPECT_EQ(response.rfind("HTTP/1.1 200", 0), 0u) << response.substr(0, 200);
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// "name{rank=\"0\"}" or "name" -> value.
std::map<std::string, double> parse(const std::string& body) {
  std::map<std::string, double> values;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    values[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return values;
}

int metrics_port(Launched& run) {
  static const std::regex re("metrics at http://0\\.0\\.0\\.0:([0-9]+)/metrics");
  std::smatch m;
  EXPECT_TRUE(run.read_until([&] { return std::regex_search(run.err(), m, re); },
                             Deadline::after(seconds(20))))
      << run.err();
  return std::stoi(m[1]);
}

// Scrapes until `done` holds of the values (at most 60 s); returns the last values.
std::map<std::string, double> scrape_until(
    Launched& run, int port, const std::function<bool(const std::map<std::string, double>&)>& done) {
  const auto deadline = Deadline::after(seconds(60));
  std::map<std::string, double> v;
  while (!deadline.expired()) {
    v = parse(scrape(port));
    if (done(v)) return v;
    run.pump(milliseconds(100));
  }
  ADD_FAILURE() << "the metrics never showed what was waited for; last scrape:\n"
                << [&] {
                     std::string s;
                     for (const auto& [k, x] : v) s += k + " " + std::to_string(x) + "\n";
                     return s;
                   }() << run.err();
  return v;
}

TEST(Metrics, AScrapeDuringTheRunShowsEachRanksStepRateAndItsComputeAgainstCommunication) {
  Launched run({"run", "-n", "2", "--metrics-port", "0", "--", kWorker, "--steps", "150",
                "--compute-ms", "20", "--slow-ms", "30", "--batch", "32"});
  const int port = metrics_port(run);
  const auto v = scrape_until(run, port, [](const auto& v) {
    auto s0 = v.find("dtrain_step{rank=\"0\"}"), s1 = v.find("dtrain_step{rank=\"1\"}");
    return s0 != v.end() && s1 != v.end() && s0->second >= 20 && s1->second >= 20 &&
           v.count("dtrain_step_seconds{rank=\"1\"}") > 0;
  });
  EXPECT_EQ(v.at("dtrain_local_ranks"), 2);
  EXPECT_EQ(v.at("dtrain_restarts_total"), 0);
  for (const std::string r : {"0", "1"}) {
    const std::string l = "{rank=\"" + r + "\"}";
    // A step is 50 ms of sleep (rank 1's 20 + 30) plus an all-reduce: 32 samples per step.
    const double step_s = v.at("dtrain_step_seconds" + l);
    EXPECT_GT(step_s, 0.045) << r;
    EXPECT_LT(step_s, 0.150) << r;
    EXPECT_NEAR(v.at("dtrain_samples_per_second" + l), 32 / step_s, 32 / step_s * 0.01) << r;
    EXPECT_NEAR(v.at("dtrain_step_compute_seconds" + l) +
                    v.at("dtrain_step_communication_seconds" + l),
                step_s, 1e-6)
        << r;
    EXPECT_EQ(v.at("dtrain_samples_total" + l), 32 * v.at("dtrain_step" + l)) << r;
    EXPECT_LT(v.at("dtrain_report_age_seconds" + l), 5) << r;
  }
  // Rank 0 waits for rank 1's extra 30 ms in every all-reduce; rank 1 hardly waits.
  EXPECT_GT(v.at("dtrain_step_communication_seconds{rank=\"0\"}"), 0.015);
  EXPECT_LT(v.at("dtrain_step_communication_seconds{rank=\"1\"}"), 0.015);
  EXPECT_GT(v.at("dtrain_step_compute_seconds{rank=\"1\"}"), 0.045);
  EXPECT_GT(v.at("dtrain_communication_seconds_total{rank=\"0\"}"),
            v.at("dtrain_communication_seconds_total{rank=\"1\"}"));

  const auto status = run.wait(seconds(60));
  ASSERT_TRUE(status);
  EXPECT_EQ(WEXITSTATUS(*status), 0) << run.err();
}

TEST(Metrics, TheRestartsOfAnElasticRunAreCountedAndTheStepsGoOn) {
  Launched run({"run", "-n", "2", "--max-restarts", "2", "--metrics-port", "0", "--", kWorker,
                "--steps", "120", "--compute-ms", "10", "--slow-ms", "0", "--fail-at", "5"});
  const int port = metrics_port(run);
  const auto v = scrape_until(run, port, [](const auto& v) {
    auto r = v.find("dtrain_restarts_total");
    auto s = v.find("dtrain_step{rank=\"0\"}");
    return r != v.end() && r->second == 1 && s != v.end() && s->second >= 10;
  });
  EXPECT_EQ(v.at("dtrain_restarts_total"), 1);
  const auto status = run.wait(seconds(60));
  ASSERT_TRUE(status);
  EXPECT_EQ(WEXITSTATUS(*status), 0) << run.err();
}

TEST(Metrics, APortInUseIsRefusedBeforeAnyWorkerStarts) {
  auto listener = net::listen_tcp("0.0.0.0", 0);
  const int busy = net::local_port(listener.get());
  Launched run({"run", "-n", "1", "--metrics-port", std::to_string(busy), "--", kWorker});
  const auto status = run.wait(seconds(30));
  ASSERT_TRUE(status);
  EXPECT_NE(WEXITSTATUS(*status), 0);
  EXPECT_NE(run.err().find("cannot serve metrics on port " + std::to_string(busy)),
            std::string::npos)
      << run.err();
  EXPECT_EQ(run.out().find("DONE"), std::string::npos);
}

}  // namespace
}  // namespace dtrain::testing
