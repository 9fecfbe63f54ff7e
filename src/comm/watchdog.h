// The straggler watchdog of a group: when one collective has been running longer than a
// threshold (DTRAIN_STRAGGLER_SECONDS, 30 s), this rank publishes when it arrived and reads
// when the others did, then logs who is waiting and who has not come, e.g.
//   collective #17 of group world, all_reduce(f32, 1024, sum), has waited 31.0 s: arrived
//   rank 0 at 12:00:01.234, rank 1 at 12:00:01.240; not arrived: rank 2
// so a straggler is named long before the timeout. Costs nothing while collectives are quick.
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
  Watchdog(Store& store, std::string group, int rank, int size, std::chrono::milliseconds threshold);
  ~Watchdog();

  void enter(uint32_t seq, const CollectiveCall& call);
  void leave();
  // "rank 0 at 12:00:01.234 (waited 3.0 s); not arrived: ranks 2, 3", after publishing ours.
  std::string arrivals(uint32_t seq);

 private:
  void run(std::stop_token stop);
  void report(uint32_t seq, const std::string& what, std::chrono::steady_clock::duration waited);
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
  uint32_t seq_ = 0;  // the running collective, 0 when none
  CollectiveCall call_;  // what the running collective is
  std::chrono::steady_clock::time_point since_;
  uint32_t reported_ = 0;
  uint32_t published_ = 0;
  std::jthread thread_;
};

}  // namespace dtrain::comm
