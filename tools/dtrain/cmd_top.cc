// `dtrain top [HOST:]PORT`: a live view of a running job from its launcher's metrics
// (`dtrain run --metrics-port PORT`), refreshed every --interval seconds: per rank the step,
// samples/s, step time split into compute and communication, calls completed per second and
// whether it is in one now, the age of its last report; then the restarts, the slowest rank,
// and, when no rank has completed a call for --stuck-after seconds while some wait in one, which
// ranks wait and which do not (`dtrain doctor` says why, from the flight records).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/deadline.h"
#include "common/socket.h"
#include "dtrain/error.h"
#include "tools/dtrain/commands.h"

namespace dtrain::tools {
namespace {

using Clock = std::chrono::steady_clock;

// metric name -> rank (-1 without a rank label) -> value
using Scrape = std::map<std::string, std::map<int, double>>;

std::string get_metrics(const net::HostPort& at, std::chrono::milliseconds limit) {
  const Deadline deadline = Deadline::after(limit);
  net::Fd fd = net::connect_tcp(at, deadline, "dtrain top");
  const std::string request = fmt::format("GET /metrics HTTP/1.0\r\nHost: {}\r\n\r\n", at.host);
  net::write_all(fd.get(), request.data(), request.size(), deadline, "dtrain top");
  std::string response;
  char buf[65536];
  while (!deadline.expired()) {
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
    if (n <= 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  const auto body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || response.find(" 200 ") == std::string::npos ||
      body == std::string::npos)
    throw UnavailableError(fmt::format(
        "dtrain top: {}:{} did not answer GET /metrics with 200 within {} ms (got {:.60})", at.host,
        at.port, limit.count(), response));
  return response.substr(body + 4);
}

Scrape parse(const std::string& body) {
  Scrape out;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    if (space == std::string::npos) continue;
    std::string name = line.substr(0, space);
    int rank = -1;
    if (const auto brace = name.find('{'); brace != std::string::npos) {
      const auto r = name.find("rank=\"", brace);
      if (r != std::string::npos) rank = std::atoi(name.c_str() + r + 6);
      name.resize(brace);
    }
    try {
      out[name][rank] = std::stod(line.substr(space + 1));
    } catch (const std::exception&) {
    }
  }
  return out;
}

std::optional<double> value(const Scrape& s, const std::string& name, int rank) {
  auto it = s.find(name);
  if (it == s.end()) return std::nullopt;
  auto v = it->second.find(rank);
  if (v == it->second.end()) return std::nullopt;
  return v->second;
}

std::string cell(std::optional<double> v, const char* format, double scale = 1) {
  return v ? fmt::format(fmt::runtime(format), *v * scale) : std::string("-");
}

// What stays between refreshes: each rank's calls, and when any rank last completed one.
struct History {
  std::map<int, double> calls;
  Clock::time_point at{};
  Clock::time_point last_progress = Clock::now();
};

std::string frame(const std::string& where, const Scrape& s, History& h,
                  std::chrono::seconds stuck_after) {
  const auto now = Clock::now();
  std::vector<int> ranks;
  for (const char* name : {"dtrain_step", "dtrain_calls_total", "dtrain_calls_in_progress"})
    if (auto it = s.find(name); it != s.end())
      for (const auto& [rank, v] : it->second)
        if (rank >= 0 && std::find(ranks.begin(), ranks.end(), rank) == ranks.end())
          ranks.push_back(rank);
  std::sort(ranks.begin(), ranks.end());
  const double dt =
      h.at == Clock::time_point{} ? 0 : std::chrono::duration<double>(now - h.at).count();
  bool progressed = h.at == Clock::time_point{};
  std::string out = fmt::format("dtrain top  {}  restarts {}  ranks {}\n", where,
                                cell(value(s, "dtrain_restarts_total", -1), "{:.0f}"),
                                cell(value(s, "dtrain_local_ranks", -1), "{:.0f}"));
  out += fmt::format("{:>5} {:>8} {:>10} {:>9} {:>11} {:>9} {:>8} {:>8} {:>11}\n", "rank", "step",
                     "samples/s", "step ms", "compute ms", "comm ms", "calls/s", "in call",
                     "report age");
  std::vector<int> waiting, not_waiting;
  std::vector<std::pair<double, int>> compute;
  for (int r : ranks) {
    const auto calls = value(s, "dtrain_calls_total", r);
    std::optional<double> rate;
    if (calls) {
      auto prev = h.calls.find(r);
      if (prev == h.calls.end() || prev->second != *calls) progressed = true;
      if (prev != h.calls.end() && dt > 0) rate = (*calls - prev->second) / dt;
      h.calls[r] = *calls;
    }
    const auto in_call = value(s, "dtrain_calls_in_progress", r);
    if (in_call) (*in_call > 0 ? waiting : not_waiting).push_back(r);
    if (auto c = value(s, "dtrain_step_compute_seconds", r)) compute.emplace_back(*c, r);
    out += fmt::format("{:>5} {:>8} {:>10} {:>9} {:>11} {:>9} {:>8} {:>8} {:>11}\n", r,
                       cell(value(s, "dtrain_step", r), "{:.0f}"),
                       cell(value(s, "dtrain_samples_per_second", r), "{:.1f}"),
                       cell(value(s, "dtrain_step_seconds", r), "{:.1f}", 1e3),
                       cell(value(s, "dtrain_step_compute_seconds", r), "{:.1f}", 1e3),
                       cell(value(s, "dtrain_step_communication_seconds", r), "{:.1f}", 1e3),
                       cell(rate, "{:.1f}"), in_call ? (*in_call > 0 ? "yes" : "no") : "-",
                       cell(value(s, "dtrain_report_age_seconds", r), "{:.1f} s"));
  }
  h.at = now;
  if (progressed) h.last_progress = now;
  if (compute.size() >= 2) {
    std::sort(compute.begin(), compute.end());
    const auto [slowest, rank] = compute.back();
    const double median = compute[(compute.size() - 1) / 2].first;
    if (median > 0 && slowest >= 1.2 * median)
      out +=
          fmt::format("slowest: rank {} computes {:.1f} ms a step, {:.1f}x the median {:.1f} ms\n",
                      rank, slowest * 1e3, slowest / median, median * 1e3);
  }
  const auto quiet = now - h.last_progress;
  if (!waiting.empty() && quiet >= stuck_after)
    out += fmt::format(
        "STUCK: no rank has completed a call for {:.0f} s; in a call: {}; not in one: {}{}\n",
        std::chrono::duration<double>(quiet).count(), fmt::join(waiting, ", "),
        not_waiting.empty() ? std::string("none") : fmt::format("{}", fmt::join(not_waiting, ", ")),
        not_waiting.empty() ? "" : " (the ones the others wait for; `dtrain doctor` says why)");
  return out;
}

}  // namespace

CLI::App* add_top_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "top", "A live view of a running job from `dtrain run --metrics-port`'s metrics");
  auto address = std::make_shared<std::string>();
  auto interval = std::make_shared<double>(1.0);
  auto count = std::make_shared<int>(0);
  auto plain = std::make_shared<bool>(false);
  auto stuck_after = std::make_shared<int>(10);
  cmd->add_option("ADDRESS", *address, "PORT, or HOST:PORT, of dtrain run --metrics-port")
      ->required();
  cmd->add_option("--interval", *interval, "Seconds between refreshes")->capture_default_str();
  cmd->add_option("--count", *count, "Stop after this many refreshes (0: until Ctrl-C)")
      ->capture_default_str();
  cmd->add_flag("--plain", *plain, "Print each refresh below the last (no screen redraw)");
  cmd->add_option("--stuck-after", *stuck_after,
                  "Call the job stuck after this many seconds without a completed call")
      ->capture_default_str();
  cmd->callback([=] {
    net::HostPort at;
    if (address->find(':') == std::string::npos)
      at = net::parse_host_port("127.0.0.1:" + *address, "dtrain top's ADDRESS");
    else
      at = net::parse_host_port(*address, "dtrain top's ADDRESS");
    if (*interval <= 0) throw InvalidArgumentError("dtrain top: --interval must be above 0");
    const bool redraw = !*plain && ::isatty(STDOUT_FILENO);
    History history;
    for (int i = 0; *count == 0 || i < *count; ++i) {
      if (i > 0) std::this_thread::sleep_for(std::chrono::duration<double>(*interval));
      std::string text;
      try {
        text = frame(fmt::format("{}:{}", at.host, at.port),
                     parse(get_metrics(at, std::chrono::milliseconds(3000))), history,
                     std::chrono::seconds(*stuck_after));
      } catch (const Error& e) {
        text = fmt::format("{}\n", e.what());
      }
      fmt::print("{}{}{}", redraw ? "\x1b[H\x1b[2J" : "", text, redraw ? "" : "\n");
      std::fflush(stdout);
    }
  });
  return cmd;
}

}  // namespace dtrain::tools
