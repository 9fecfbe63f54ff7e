// `dtrain run --metrics-port`: the workers' progress (dtrain::ProgressReporter) and the
// launcher's restarts, scraped over HTTP as Prometheus text while the job runs, with values that
// follow from what the workers do (progress_worker.cc: rank 1 computes 30 ms longer each step, so
// rank 0 waits about that long in the all-reduce).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <poll.h>
#include <sys/socket.h>

#include <filesystem>
#include <map>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "command.h"
#include "launch/launched.h"
#include "support/temp_dir.h"

namespace dtrain::testing {
namespace {

const std::string kBin = DTRAIN_BIN_DIR;
const std::string kWorker = kBin + "/progress_worker";

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
  static const std::regex re("metrics at http://[0-9.]+:([0-9]+)/metrics");
  std::smatch m;
  EXPECT_TRUE(run.read_until([&] { return std::regex_search(run.err(), m, re); },
                             Deadline::after(seconds(20))))
      << run.err();
  return std::stoi(m[1]);
}

// Scrapes until `done` holds of the values (at most 60 s); returns the last values.
std::map<std::string, double> scrape_until(
    Launched& run, int port,
    const std::function<bool(const std::map<std::string, double>&)>& done) {
  const auto deadline = Deadline::after(seconds(60));
  std::map<std::string, double> v;
  while (!deadline.expired()) {
    v = parse(scrape(port));
    if (done(v)) return v;
    run.pump(milliseconds(100));
  }
  ADD_FAILURE() << "the metrics never showed what was waited for; last scrape:\n"
                <<
      [&] {
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
    EXPECT_NEAR(
        v.at("dtrain_step_compute_seconds" + l) + v.at("dtrain_step_communication_seconds" + l),
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
  EXPECT_NE(run.err().find("cannot serve metrics on 0.0.0.0:" + std::to_string(busy)),
            std::string::npos)
      << run.err();
  EXPECT_EQ(run.out().find("DONE"), std::string::npos);
}

// The port faces the network: hundreds of idle connections (which once filled the server's only
// thread and its accept queue, so that a scrape was reset after 4 s) and connections sending
// garbage must not keep a scrape from its answer.
TEST(Metrics, AScrapeIsAnsweredWhileHundredsOfIdleAndGarbageConnectionsAreOpen) {
  Launched run({"run", "-n", "1", "--metrics-port", "0", "--", kWorker, "--steps", "400",
                "--compute-ms", "50", "--slow-ms", "0"});
  const int port = metrics_port(run);
  const net::HostPort at{"127.0.0.1", static_cast<uint16_t>(port)};
  std::vector<net::Fd> idle, garbage;
  for (int i = 0; i < 300; ++i)
    idle.push_back(net::connect_tcp(at, Deadline::after(seconds(5)), "idle"));
  const std::string junk = "\x16\x03\x01 not http at all\r\n\r\n";
  for (int i = 0; i < 100; ++i) {
    garbage.push_back(net::connect_tcp(at, Deadline::after(seconds(5)), "garbage"));
    net::write_all(garbage.back().get(), junk.data(), junk.size(), Deadline::after(seconds(5)),
                   "garbage");
  }
  const auto start = std::chrono::steady_clock::now();
  const auto v = parse(scrape(port));
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(2));
  EXPECT_EQ(v.at("dtrain_local_ranks"), 1);
}

TEST(Metrics, AnIdleConnectionIsClosedWithinSeconds) {
  Launched run({"run", "-n", "1", "--metrics-port", "0", "--", kWorker, "--steps", "400",
                "--compute-ms", "50", "--slow-ms", "0"});
  const int port = metrics_port(run);
  auto fd = net::connect_tcp({"127.0.0.1", static_cast<uint16_t>(port)},
                             Deadline::after(seconds(5)), "idle");
  // Half a request, then nothing: a slow client holds nothing for long either.
  net::write_all(fd.get(), "GET /metr", 9, Deadline::after(seconds(5)), "slow");
  const auto start = std::chrono::steady_clock::now();
  pollfd p{fd.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 15000), 1) << "the server never closed an idle connection";
  char c;
  EXPECT_EQ(::recv(fd.get(), &c, 1, 0), 0);  // closed, nothing sent
  const auto closed_after = std::chrono::steady_clock::now() - start;
  EXPECT_GT(closed_after, seconds(3));
  EXPECT_LT(closed_after, seconds(8));
}

// Whether this machine has an IPv4 address besides loopback: "" when not.
std::string other_address() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    if (std::string(text).rfind("127.", 0) != 0) found = text;
  }
  ::freeifaddrs(list);
  return found;
}

TEST(Metrics, MetricsAddrChoosesTheInterface) {
  Launched run({"run", "-n", "1", "--metrics-port", "0", "--metrics-addr", "127.0.0.1", "--",
                kWorker, "--steps", "400", "--compute-ms", "50", "--slow-ms", "0"});
  const int port = metrics_port(run);
  EXPECT_NE(run.err().find("metrics at http://127.0.0.1:"), std::string::npos) << run.err();
  EXPECT_EQ(parse(scrape(port)).at("dtrain_local_ranks"), 1);
  const std::string other = other_address();
  if (!other.empty()) {
    EXPECT_THROW(net::connect_tcp({other, static_cast<uint16_t>(port)}, Deadline::after(seconds(2)),
                                  "elsewhere"),
                 Error)
        << "the port answered on " << other;
  }

  Launched bad({"run", "-n", "1", "--metrics-port", "0", "--metrics-addr", "every", "--", kWorker});
  const auto status = bad.wait(seconds(30));
  ASSERT_TRUE(status);
  EXPECT_NE(WEXITSTATUS(*status), 0);
  EXPECT_NE(bad.err().find("--metrics-addr is 'every': give an IPv4 address"), std::string::npos)
      << bad.err();
}

// `dtrain top PORT`: the same figures as a table, the slowest rank named.
TEST(Metrics, TopShowsEveryRankAndNamesTheSlowest) {
  Launched run({"run", "-n", "2", "--metrics-port", "0", "--", kWorker, "--steps", "400",
                "--compute-ms", "20", "--slow-ms", "30"});
  const int port = metrics_port(run);
  std::this_thread::sleep_for(seconds(2));  // a report from each rank
  const auto top = run_command({kBin + "/dtrain", "top", std::to_string(port), "--count", "2",
                                "--interval", "1", "--plain"});
  EXPECT_EQ(top.exit_code, 0) << top.output;
  EXPECT_NE(top.output.find("rank     step  samples/s"), std::string::npos) << top.output;
  // Rank 1 computes 50 ms a step, rank 0 20 ms and waits 30 ms for it.
  EXPECT_NE(top.output.find("slowest: rank 1 computes"), std::string::npos) << top.output;
  EXPECT_EQ(top.output.find("STUCK"), std::string::npos) << top.output;
}

// A job that hangs (rank 1 in its own code, the others in an all-reduce): top says which ranks
// wait and which one they wait for.
TEST(Metrics, TopNamesTheRanksAStuckJobWaitsFor) {
  ::setenv("DTRAIN_HANG_SECONDS", "0", 1);  // the launcher leaves it running for top to see
  Launched run({"run", "-n", "3", "--metrics-port", "0", "--", kBin + "/fault_worker", "--fault",
                "compute"});
  ::unsetenv("DTRAIN_HANG_SECONDS");
  const int port = metrics_port(run);
  const auto top = run_command({kBin + "/dtrain", "top", std::to_string(port), "--count", "6",
                                "--interval", "1", "--plain", "--stuck-after", "3"});
  EXPECT_EQ(top.exit_code, 0) << top.output;
  EXPECT_NE(top.output.find("STUCK: no rank has completed a call for"), std::string::npos)
      << top.output;
  EXPECT_NE(top.output.find("in a call: 0, 2; not in one: 1"), std::string::npos) << top.output;
}

// The page at /: loaded in headless Chromium (Debian's chromium) from a running job, its table,
// plot and timeline checked against the job, and a screenshot kept as the test's artifact
// (build/test-artifacts/metrics_page.png).
TEST(Metrics, ThePageShowsTheJobInABrowser) {
  const std::string chromium = find_program("chromium");
  if (chromium.empty()) GTEST_SKIP() << "no chromium (scripts/install-deps.sh installs it)";
  Launched run({"run", "-n", "2", "--metrics-port", "0", "--", kWorker, "--steps", "600",
                "--compute-ms", "20", "--slow-ms", "30"});
  const int port = metrics_port(run);
  std::this_thread::sleep_for(seconds(4));  // a few samples of the run
  TempDir profile;
  const std::string url = fmt::format("http://127.0.0.1:{}/", port);
  const std::vector<std::string> browser{chromium,
                                         "--headless",
                                         "--no-sandbox",
                                         "--disable-gpu",
                                         "--user-data-dir=" + profile.path,
                                         "--virtual-time-budget=3000",
                                         "--window-size=1000,1000"};
  auto with = [&](std::vector<std::string> extra) {
    auto argv = browser;
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back(url);
    return run_command(argv, {.timeout = seconds(90)});
  };
  const auto dom = with({"--dump-dom"});
  ASSERT_EQ(dom.exit_code, 0) << dom.output;
  const auto v = parse(scrape(port));
  const std::string& html = dom.output;
  // The table: a row per rank, with the step the metrics say (the page's is a second older).
  for (int r = 0; r < 2; ++r) {
    const std::smatch m = [&] {
      std::smatch m;
      std::regex_search(
          html, m, std::regex(fmt::format("<tr id=\"rank-{0}\"><td>{0}</td><td>([0-9]+)</td>", r)));
      return m;
    }();
    ASSERT_FALSE(m.empty()) << "no row for rank " << r << " in\n" << html;
    const double step = std::stod(m[1]);
    EXPECT_GT(step, 10) << r;
    EXPECT_LE(step, v.at(fmt::format("dtrain_step{{rank=\"{}\"}}", r))) << r;
    EXPECT_GT(step, v.at(fmt::format("dtrain_step{{rank=\"{}\"}}", r)) - 60) << r;
  }
  // Rank 1 computes 50 ms a step against rank 0's 20.
  EXPECT_NE(html.find("slowest: rank 1 computes"), std::string::npos) << html;
  // Step time plotted for each rank; the last steps drawn as compute and communication.
  EXPECT_NE(html.find("<polyline points=\""), std::string::npos) << html;
  EXPECT_NE(html.find("data-rank=\"1\""), std::string::npos) << html;
  EXPECT_NE(html.find("class=\"compute\""), std::string::npos) << html;
  EXPECT_NE(html.find("class=\"communication\""), std::string::npos) << html;
  EXPECT_NE(html.find("<div id=\"stuck\"></div>"), std::string::npos) << html;  // not stuck

  const std::string artifacts = kBin + "/../test-artifacts";
  std::filesystem::create_directories(artifacts);
  const auto shot = with({"--screenshot=" + artifacts + "/metrics_page.png"});
  EXPECT_EQ(shot.exit_code, 0) << shot.output;
  EXPECT_GT(std::filesystem::file_size(artifacts + "/metrics_page.png"), 10000u);
}

}  // namespace
}  // namespace dtrain::testing
