// The hang monitor of `dtrain run`: watches the beat page of every local worker's flight
// recorder (DIR/rank<R>.beat, comm/flight_recorder.h) and
//   - calls the job stuck when a rank has been inside a call for DTRAIN_HANG_SECONDS while no
//     rank completed any: it asks every worker for its flight record (SIGUSR2), waits a few
//     seconds for them, prints `dtrain doctor`'s diagnosis and asks the supervisor to stop the
//     job (stop_fd());
//   - names a rank that spends much longer outside calls than the others over the same window
//     (the others wait for it), once per rank and again when it changes.
// A job in a long phase without calls (evaluation, a checkpoint) is not stuck: nobody waits.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/socket.h"

namespace dtrain::launch {

// The exit status of a job stopped because it was stuck (as timeout(1)'s).
constexpr int kStuckExitCode = 124;

struct HangMonitorOptions {
  std::string dir;                        // the workers' DTRAIN_FLIGHT_DIR
  std::chrono::milliseconds hang{60000};  // 0 = never call the job stuck
  std::chrono::milliseconds poll{500};
  // The slow-rank check compares the ranks over windows this long, or `hang` when longer.
  std::chrono::milliseconds slow_window{10000};
  std::chrono::milliseconds dump_wait{5000};  // for the records after SIGUSR2
  std::string name = "dtrain run";            // how its lines begin
  std::string stopping = "the job";           // what it stops: "stopping the job"
  int out_fd = 2;
};

class HangMonitor {
 public:
  explicit HangMonitor(HangMonitorOptions options);
  ~HangMonitor();  // stops the thread
  HangMonitor(const HangMonitor&) = delete;
  HangMonitor& operator=(const HangMonitor&) = delete;

  // Readable once the monitor called the job stuck (SupervisorOptions::stop_fd).
  int stop_fd() const { return stop_read_.get(); }
  bool fired() const;
  // Asks every worker with a beat for its flight record (SIGUSR2 to the recording process).
  void request_records() const;

 private:
  void run(std::stop_token stop);
  void on_stuck(const std::string& why);

  HangMonitorOptions options_;
  net::Fd stop_read_, stop_write_;
  mutable std::mutex mu_;  // guards fired_; for cv_
  std::condition_variable_any cv_;
  bool fired_ = false;
  std::jthread thread_;  // last: starts once the rest is set
};

// One worker's beat page (comm::FlightBeat), as the launcher reads it.
struct BeatReading {
  int rank = -1;
  int64_t pid = 0;
  uint64_t completed = 0;  // calls ended
  int64_t in_calls = 0;    // calls it is in now
  int64_t inside_ns = 0;   // total time inside calls
};
// Every rank's beat page in `dir`, by rank (a page being created is skipped until it is whole).
std::vector<BeatReading> read_beats(const std::string& dir);

// The diagnosis of the records in `dir` written since `since` (seconds since the epoch), as
// `dtrain doctor` prints it, or "" when there are none.
std::string diagnose_directory(const std::string& dir, double since);

}  // namespace dtrain::launch
