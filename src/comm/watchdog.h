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

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/collective.h"
#include "common/deadline.h"
#include "dtrain/store.h"

namespace dtrain::comm {

class Watchdog {
 public:
  Watchdog(Store& store, std::string group, int rank, int size,
           std::chrono::milliseconds threshold);
  ~Watchdog();

  // The collective `seq` runs, waited for since its deadline started (its limit is quoted in
  // the reports). Called by the thread that runs it, one collective at a time; costs a few
  // stores (no lock, no clock): every collective calls it.
  void enter(uint32_t seq, const CollectiveCall& call, const Deadline& deadline);
  void leave();
  struct Arrivals {
    // "rank 0 at 12:00:01.234 (waited 3.0 s); not arrived: ranks 2, 3"
    std::string text;
    // Group ranks that never arrived at it (behind, stuck or gone), whatever they said since.
    std::vector<int> not_arrived;
    bool lowest_waiting = false;  // no rank below this one has arrived
  };
  // Who arrived at collective `seq` and who did not, after publishing this rank's arrival.
  Arrivals arrivals(uint32_t seq) { return read_arrivals(seq); }
  // Publishes this rank's arrival at the running collective `seq`: a failing rank does so before
  // its post-mortem statement, so that a peer that read the statement finds the arrival too.
  void publish_arrival(uint32_t seq);
  // This rank called `seq` but never entered it, its group having failed it already (a peer's
  // notice came first): published as an arrival now, so that the peers' post-mortems do not call
  // it not arrived.
  void publish_call(uint32_t seq);
  // A peer's notice that `seq` failed, which this rank called (running it, or not yet): its
  // arrival, published before the statement the notice makes it write, as publish_arrival. From
  // any thread (the notice comes on the transport's).
  void publish_called(uint32_t seq);

 private:
  void run(std::stop_token stop);
  Arrivals read_arrivals(uint32_t seq);
  void report(uint32_t seq, const std::string& what, std::chrono::steady_clock::duration waited,
              std::chrono::milliseconds limit);
  void publish(uint32_t seq, int64_t arrived_ms);
  // The running collective as enter() described it; seq 0 when none.
  struct Running {
    uint32_t seq = 0;
    CollectiveCall call;
    std::chrono::milliseconds limit{0};
    std::chrono::steady_clock::time_point since;
  };
  Running running() const;
  // When the running collective arrived (entered at `since`), in ms since the epoch.
  int64_t arrived_ms() const;
  static int64_t arrived_ms(std::chrono::steady_clock::time_point since);

  Store& store_;
  std::string group_;
  int rank_;
  int size_;
  std::chrono::milliseconds threshold_;

  // The running collective (Running), written by enter() and leave() as a seqlock: seq_ is 0
  // while the rest changes and last, so that a reader that finds the same nonzero seq_ before
  // and after reading the rest has read one collective's fields.
  std::atomic<uint32_t> seq_{0};
  std::atomic<uint64_t> head_{0}, count_{0};  // the call (CollectiveCall::head)
  std::atomic<int64_t> limit_ms_{0}, since_ns_{0};

  // The watchdog's thread's own (cv_ wakes it to stop).
  std::mutex mu_;
  std::condition_variable_any cv_;
  uint32_t watched_ = 0;                               // the collective next_report_ is for
  std::chrono::steady_clock::duration next_report_{};  // waited this long: report again
  uint32_t published_ = 0;
  std::jthread thread_;
};

}  // namespace dtrain::comm
