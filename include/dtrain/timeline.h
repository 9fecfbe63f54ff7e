// Timeline: Chrome-trace events (forward, backward, each bucket's all-reduce, the optimizer
// step) so overlap and stragglers can be seen in Perfetto (ui.perfetto.dev) or chrome://tracing.
//
//   DTRAIN_TIMELINE=trace.json dtrain run -n 2 -- build/bin/train_fashion_mnist
//   # rank r writes trace.rank<r>.json; `jq -s add trace.rank*.json > trace.json` merges them
//   # (each rank is its own process row, pid = rank).
//
// Off (a null check per event) unless DTRAIN_TIMELINE is set. Thread-safe; written at exit.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace dtrain {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  // The process's timeline, or null when DTRAIN_TIMELINE is unset. The first call that passes a
  // rank names the file; later calls return the same timeline.
  static Timeline* get(int rank = -1);

  // A complete event ("X") of `name` on row `track` (e.g. "compute", "comm").
  void add(const std::string& name, const std::string& track, Clock::time_point start,
           Clock::time_point end, const std::string& args_json = "");
  // Writes the file now (also done at exit).
  void flush();

  ~Timeline();

 private:
  struct State;
  explicit Timeline(std::string path, int rank);
  std::unique_ptr<State> state_;
};

// Records [construction, destruction) as one event when the timeline is on.
class TimelineSpan {
 public:
  TimelineSpan(const char* name, const char* track)
      : timeline_(Timeline::get()), name_(name), track_(track) {
    if (timeline_ != nullptr) start_ = Timeline::Clock::now();
  }
  ~TimelineSpan() {
    if (timeline_ != nullptr) timeline_->add(name_, track_, start_, Timeline::Clock::now());
  }
  TimelineSpan(const TimelineSpan&) = delete;
  TimelineSpan& operator=(const TimelineSpan&) = delete;

 private:
  Timeline* timeline_;
  const char* name_;
  const char* track_;
  Timeline::Clock::time_point start_{};
};

}  // namespace dtrain
