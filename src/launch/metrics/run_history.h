// What `dtrain run --metrics-port`'s page at / plots: each local rank's figures, sampled once a
// second by a thread of its own for the whole run (the oldest half thinned out, and the interval
// doubled, whenever the record fills), so that the page shows the run from its start whenever it
// is opened. Also the one reading of a rank's figures, shared with the Prometheus metrics.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "launch/hang_monitor.h"
#include "launch/progress_file.h"

namespace dtrain::launch {

// A rank's latest progress report (ProgressReporter) and flight-recorder beat, when it has them.
struct RankFigures {
  int rank = 0;
  std::optional<ProgressReport> report;
  std::optional<BeatReading> beat;
};
std::vector<RankFigures> read_figures(const std::string& progress_dir,
                                      const std::string& flight_dir, int first_rank, int ranks);

class RunHistory {
 public:
  struct Sources {
    std::string progress_dir, flight_dir;
    int first_rank = 0, ranks = 0, restarts = 0;
  };
  // `sources()` is asked at each sample (the ranks and restarts change during a run).
  explicit RunHistory(std::function<Sources()> sources,
                      std::chrono::milliseconds interval = std::chrono::milliseconds(1000),
                      size_t capacity = 3600);
  ~RunHistory();  // stops the sampler
  RunHistory(const RunHistory&) = delete;
  RunHistory& operator=(const RunHistory&) = delete;

  // {"time": now, "restarts": n, "ranks": [..], "samples": [{"time": t, "ranks": [{"rank": r,
  //  "step": .., "step_seconds": .., "compute_seconds": .., "communication_seconds": ..,
  //  "samples_per_second": .., "calls": .., "in_calls": ..}, ...]}, ...]}
  std::string json() const;

 private:
  void run(std::stop_token stop);
  struct Sample {
    double time = 0;
    std::vector<RankFigures> ranks;
  };

  std::function<Sources()> sources_;
  std::chrono::milliseconds interval_;
  const size_t capacity_;
  mutable std::mutex mu_;  // guards samples_, restarts_, ranks_, interval_; for cv_
  std::condition_variable_any cv_;
  std::deque<Sample> samples_;
  int restarts_ = 0;
  std::vector<int> ranks_;
  std::jthread thread_;  // last: starts once the rest is set
};

}  // namespace dtrain::launch
