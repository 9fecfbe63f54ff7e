// ProgressReporter: what a training loop tells its launcher after each step, so that `dtrain run
// --metrics-port P` can serve it to Prometheus (step, samples/s, the step's time split into
// compute and exposed communication; docs/metrics.md):
//
//   dtrain::ProgressReporter progress(pg->rank());
//   for (; step < steps; ++step) {
//     train_one_step(...);
//     progress.step(step + 1, batch_size);   // the step just finished, this rank's samples in it
//   }
//
// Communication is the time the process spent in Work::wait during the step (collectives that
// overlapped the backward pass cost nothing there); compute is the rest of the step. Without
// `--metrics-port` (DTRAIN_PROGRESS_DIR unset) a reporter does nothing and costs a branch.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dtrain {

struct ProgressOptions {
  // A report is written at most this often (and by the destructor), so that a fast loop pays
  // for one small file write per interval, not per step.
  std::chrono::milliseconds interval{500};
};

class ProgressReporter {
 public:
  // Reports as `rank` to DTRAIN_PROGRESS_DIR, when set.
  explicit ProgressReporter(int rank, ProgressOptions options = {});
  ~ProgressReporter();  // writes what is not yet written
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // Step `step` (the job's step number, so that a resumed run continues its count) ended now,
  // having trained `samples` samples on this rank. The first call only starts the clock.
  void step(int64_t step, int64_t samples);

  bool active() const { return !path_.empty(); }

 private:
  using Clock = std::chrono::steady_clock;
  void write();

  ProgressOptions options_;
  std::string path_;  // DIR/rank<r>.progress; empty = inactive
  int64_t step_ = -1;
  int64_t samples_total_ = 0;
  double compute_total_s_ = 0, communication_total_s_ = 0;
  // Since the last report written:
  Clock::time_point window_start_{};
  int64_t window_steps_ = 0, window_samples_ = 0;
  double window_communication_s_ = 0;
  Clock::time_point last_step_{};
  std::chrono::nanoseconds last_waited_{};
  bool unwritten_ = false;
};

// Tells the launcher where this job resumed from (`what`: "from step 120 (epoch 1)" or the
// checkpoint's path and position). `dtrain run` in elastic mode then says, for the round,
// "rank R resumed from ..., training again S s after round N-1 stopped". The launcher reads it
// from the round's store (the one at MASTER_ADDR:MASTER_PORT when DTRAIN_AGENT_STORE=1), not
// from the worker's output; the first rank to announce in a round is the one reported. Without
// a launcher's store it does nothing. Never throws: a store it cannot reach is logged.
void announce_resumed(int rank, const std::string& what);

}  // namespace dtrain
