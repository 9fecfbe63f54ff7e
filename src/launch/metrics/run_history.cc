#include "launch/metrics/run_history.h"

#include <nlohmann/json.hpp>

namespace dtrain::launch {
namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::vector<RankFigures> read_figures(const std::string& progress_dir,
                                      const std::string& flight_dir, int first_rank, int ranks) {
  std::vector<RankFigures> out;
  for (int rank = first_rank; rank < first_rank + ranks; ++rank)
    out.push_back({rank, read_progress_file(progress_dir + "/" + progress_file_name(rank), rank),
                   std::nullopt});
  if (!flight_dir.empty())
    for (const auto& b : read_beats(flight_dir))
      if (b.rank >= first_rank && b.rank < first_rank + ranks) out[b.rank - first_rank].beat = b;
  return out;
}

RunHistory::RunHistory(std::function<Sources()> sources, std::chrono::milliseconds interval,
                       size_t capacity)
    : sources_(std::move(sources)), interval_(interval), capacity_(std::max<size_t>(capacity, 2)) {
  thread_ = std::jthread([this](std::stop_token stop) { run(stop); });
}

RunHistory::~RunHistory() {
  thread_.request_stop();
  cv_.notify_all();
}

void RunHistory::run(std::stop_token stop) {
  while (!stop.stop_requested()) {
    const Sources s = sources_();
    Sample sample{unix_now(), read_figures(s.progress_dir, s.flight_dir, s.first_rank, s.ranks)};
    std::unique_lock lock(mu_);
    restarts_ = s.restarts;
    ranks_.clear();
    for (int r = s.first_rank; r < s.first_rank + s.ranks; ++r) ranks_.push_back(r);
    samples_.push_back(std::move(sample));
    if (samples_.size() >= capacity_) {
      // The whole run stays: every other sample goes, and sampling slows to match.
      std::deque<Sample> kept;
      for (size_t i = 0; i < samples_.size(); i += 2) kept.push_back(std::move(samples_[i]));
      samples_ = std::move(kept);
      interval_ *= 2;
    }
    cv_.wait_for(lock, stop, interval_, [] { return false; });
  }
}

std::string RunHistory::json() const {
  using nlohmann::json;
  std::lock_guard lock(mu_);
  json samples = json::array();
  for (const Sample& s : samples_) {
    json ranks = json::array();
    for (const RankFigures& f : s.ranks) {
      json r{{"rank", f.rank}};
      if (f.report) {
        const ProgressReport& p = *f.report;
        r["step"] = p.step;
        if (p.window_steps > 0 && p.window_seconds > 0) {
          const double step = p.window_seconds / p.window_steps;
          const double comm = p.window_communication_seconds / p.window_steps;
          r["step_seconds"] = step;
          r["compute_seconds"] = step - comm;
          r["communication_seconds"] = comm;
          r["samples_per_second"] = p.window_samples / p.window_seconds;
        }
        r["report_age_seconds"] = s.time - p.time_unix;
      }
      if (f.beat) {
        r["calls"] = f.beat->completed;
        r["in_calls"] = f.beat->in_calls;
      }
      ranks.push_back(std::move(r));
    }
    samples.push_back({{"time", s.time}, {"ranks", std::move(ranks)}});
  }
  return json{{"time", unix_now()},
              {"restarts", restarts_},
              {"ranks", ranks_},
              {"samples", std::move(samples)}}
      .dump();
}

}  // namespace dtrain::launch
