// The straggler watchdog of a group: when one collective has been running longer than the
// report interval (DTRAIN_STRAGGLER_SECONDS, 10 s), each waiting rank publishes when it arrived,
// and the lowest-numbered waiting rank logs, then again every interval until the collective ends,
// who is waiting and who has not come, e.g.
//   rank 0: collective #17 of group world, all_reduce(f32, 1024, sum), has waited 10.0 s of its
//   300 s limit: arrived: rank 0 at 12:00:01.234 (waiting 10.0 s), rank 1 at ...; not arrived:
//   rank 2
// so a straggler is named long before the timeout, by one rank rather than all of them (the
// others log it at debug level). Costs nothing while collectives are quick.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "comm/collective.h"
#include "dtrain/store.h"

namespace dtrain::comm {

class Watchdog {
 public:
  Watchdog(Store& store, std::string group, int rank, int size,
           std::chrono::milliseconds threshold);
  ~Watchdog();

  // `limit`: the collective's timeout, quoted in the reports.
  void enter(uint32_t seq, const CollectiveCall& call, std::chrono::milliseconds limit);
  void leave();
  // "rank 0 at 12:00:01.234 (waited 3.0 s); not arrived: ranks 2, 3", after publishing ours.
  std::string arrivals(uint32_t seq);
  // Publishes this rank's arrival at the running collective `seq`: a failing rank does so before
  // its post-mortem statement, so that a peer that read the statement finds the arrival too.
  void publish_arrival(uint32_t seq);

 private:
  void run(std::stop_token stop);
  struct Arrivals {
    std::string text;
    bool lowest_waiting = false;  // no rank below this one has arrived
  };
  Arrivals read_arrivals(uint32_t seq);
  void report(uint32_t seq, const std::string& what, std::chrono::steady_clock::duration waited,
              std::chrono::milliseconds limit);
  void publish(uint32_t seq, int64_t arrived_ms);
  // When the running collective arrived, in ms since the epoch (mu_ held).
  int64_t arrived_ms_locked() const;

  Store& store_;
  std::string group_;
  int rank_;
  int size_;
  std::chrono::milliseconds threshold_;

  std::mutex mu_;  // guards the fields below
  std::condition_variable_any cv_;
  uint32_t seq_ = 0;     // the running collective, 0 when none
  CollectiveCall call_;  // what the running collective is
  std::chrono::milliseconds limit_{0};
  std::chrono::steady_clock::time_point since_;
  std::chrono::steady_clock::duration next_report_{};  // waited this long: report again
  uint32_t published_ = 0;
  std::jthread thread_;
};

}  // namespace dtrain::comm
