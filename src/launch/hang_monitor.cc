#include "launch/hang_monitor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/flight_recorder.h"
#include "dtrain/error.h"
#include "launch/doctor.h"

namespace dtrain::launch {
namespace {

using Clock = std::chrono::steady_clock;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace

std::vector<BeatReading> read_beats(const std::string& dir) {
  std::vector<BeatReading> beats;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".beat") continue;
    net::Fd fd(::open(e.path().c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) continue;
    comm::FlightBeat beat;  // a copy of the worker's page
    if (::pread(fd.get(), &beat, sizeof beat, 0) != static_cast<ssize_t>(sizeof beat)) continue;
    if (beat.magic != comm::FlightBeat::kMagic) continue;
    const comm::FlightBeat::Totals t = beat.totals();
    beats.push_back({static_cast<int>(beat.rank), beat.pid, t.completed, t.in_calls(),
                     static_cast<int64_t>(t.inside_ns)});
  }
  std::sort(beats.begin(), beats.end(), [](auto& a, auto& b) { return a.rank < b.rank; });
  return beats;
}

std::string diagnose_directory(const std::string& dir, double since) {
  std::vector<RankRecord> records;
  try {
    records = read_flight_records(dir);
  } catch (const Error&) {
    return "";
  }
  std::erase_if(records, [&](const RankRecord& r) { return r.time < since; });
  if (records.empty()) return "";
  return describe(diagnose(records), records, dir);
}

HangMonitor::HangMonitor(HangMonitorOptions options) : options_(std::move(options)) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw InternalError(fmt::format("{}: pipe for the hang monitor failed: {}", options_.name,
                                    std::strerror(errno)));
  stop_read_ = net::Fd(fds[0]);
  stop_write_ = net::Fd(fds[1]);
  thread_ = std::jthread([this](std::stop_token stop) { run(stop); });
}

HangMonitor::~HangMonitor() {
  thread_.request_stop();
  cv_.notify_all();
}

bool HangMonitor::fired() const {
  std::lock_guard lock(mu_);
  return fired_;
}

void HangMonitor::run(std::stop_token stop) {
  std::map<int, BeatReading> last;  // the previous poll's beats, by rank
  auto last_progress = Clock::now();
  std::optional<Clock::time_point> stuck_since;  // someone waits and nobody completes
  // The slow-rank check: each rank's page at the start of its window, and the wall time. A rank
  // whose process changed within the window (live recovery: a replacement or a spare took the
  // place) is not compared in it: its new page counts from another start.
  std::map<int, BeatReading> window_start_beats;
  auto window_start = Clock::now();
  const auto window = std::max(options_.hang, options_.slow_window);
  int named_slow = -1;
  while (!stop.stop_requested()) {
    {
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, stop, options_.poll, [] { return false; });
    }
    if (stop.stop_requested()) return;
    const auto now = Clock::now();
    const auto beats = read_beats(options_.dir);
    bool progressed = false, waiting = false;
    for (const auto& b : beats) {
      auto it = last.find(b.rank);
      if (it == last.end() || it->second.completed != b.completed || it->second.pid != b.pid)
        progressed = true;
      if (b.in_calls > 0) waiting = true;
      last[b.rank] = b;
    }
    if (progressed) last_progress = now;
    if (progressed || !waiting) {
      stuck_since.reset();
    } else if (!stuck_since) {
      stuck_since = now;
    }
    if (options_.hang.count() > 0 && stuck_since && now - last_progress >= options_.hang &&
        now - *stuck_since + options_.poll >= options_.hang) {
      std::vector<int> in_calls;
      for (const auto& b : beats)
        if (b.in_calls > 0) in_calls.push_back(b.rank);
      on_stuck(
          fmt::format("{}: no rank has completed a call for {:.1f} s while rank{} {} wait{} in one "
                      "(DTRAIN_HANG_SECONDS={:g})",
                      options_.name, std::chrono::duration<double>(now - last_progress).count(),
                      in_calls.size() == 1 ? "" : "s", fmt::join(in_calls, ", "),
                      in_calls.size() == 1 ? "s" : "", options_.hang.count() / 1000.0));
      return;
    }
    // Slow rank: outside time per rank over the window, when every rank completed calls in it
    // (whether one completed since the last poll says nothing of a window: steps can be longer
    // than polls).
    if (now - window_start >= window) {
      const double wall = std::chrono::duration<double>(now - window_start).count();
      std::vector<std::pair<double, int>> outside;
      bool every_rank_completed = true;
      for (const auto& b : beats) {
        auto it = window_start_beats.find(b.rank);
        if (it == window_start_beats.end() || it->second.pid != b.pid) continue;
        if (b.completed == it->second.completed) every_rank_completed = false;
        const double inside = (b.inside_ns - it->second.inside_ns) * 1e-9;
        outside.emplace_back(std::clamp(wall - inside, 0.0, wall), b.rank);
      }
      if (outside.size() >= 2 && outside.size() == beats.size() && every_rank_completed) {
        std::sort(outside.begin(), outside.end());
        const auto [slowest, rank] = outside.back();
        const double median = outside[(outside.size() - 1) / 2].first;
        if (slowest >= 1.5 * median && slowest - median >= 0.5 && rank != named_slow) {
          named_slow = rank;
          write_all(options_.out_fd,
                    fmt::format("{}: rank {} is slow: {:.1f}x the other ranks' time outside "
                                "calls over the last {:.0f} s ({:.1f} s against a median of "
                                "{:.1f} s); the others wait for it in their collectives\n",
                                options_.name, rank, median > 0 ? slowest / median : 99.0, wall,
                                slowest, median));
        } else if (slowest < 1.2 * median) {
          named_slow = -1;
        }
      }
      window_start = now;
      window_start_beats.clear();
      for (const auto& b : beats) window_start_beats[b.rank] = b;
    } else if (window_start_beats.empty()) {
      for (const auto& b : beats) window_start_beats[b.rank] = b;
      window_start = now;
    }
  }
}

void HangMonitor::request_records() const {
  for (const auto& b : read_beats(options_.dir))
    if (b.pid > 0) ::kill(static_cast<pid_t>(b.pid), SIGUSR2);
}

void HangMonitor::on_stuck(const std::string& why) {
  const double asked = unix_now();
  auto beats = read_beats(options_.dir);
  write_all(options_.out_fd, fmt::format("{}: asking every rank for its flight record\n", why));
  request_records();
  // Wait for a record from every rank that has a beat (a stopped one never writes).
  const auto deadline = Clock::now() + options_.dump_wait;
  while (Clock::now() < deadline) {
    size_t written = 0;
    for (const auto& b : beats) {
      struct stat st {};
      const std::string path = fmt::format("{}/rank{}.json", options_.dir, b.rank);
      if (::stat(path.c_str(), &st) == 0 &&
          st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9 >= asked - 1)
        ++written;
    }
    if (written == beats.size()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::string diagnosis = diagnose_directory(options_.dir, asked - 1);
  if (diagnosis.empty()) diagnosis = "dtrain doctor: no rank wrote a flight record in time\n";
  write_all(options_.out_fd,
            fmt::format("{}{}: stopping {} (records: {}; `dtrain doctor {}` again for "
                        "--json)\n",
                        diagnosis, options_.name, options_.stopping, options_.dir, options_.dir));
  {
    std::lock_guard lock(mu_);
    fired_ = true;
  }
  const char byte = 1;
  [[maybe_unused]] auto n = ::write(stop_write_.get(), &byte, 1);
}

}  // namespace dtrain::launch
