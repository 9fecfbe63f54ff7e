// The recent collectives of one group on this rank, kept by the group and written under the lock
// it numbers calls under. They serve two readers: the post-mortem of a failed collective, which
// says what this rank called as collective #k (comm/postmortem.h), and, for a group the flight
// recorder records, the recorder, which adds each call's algorithm, caller, times and state to
// the same entry and lists the group's calls in its dumps (comm/flight_recorder.h). One entry
// serves both, so that recording a collective costs only the fields the post-mortem does not
// need (docs/performance.md, "The flight recorder's cost").
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "comm/collective.h"

namespace dtrain::comm {

class CallHistory {
 public:
  // Keeps the last `keep` collectives (rounded up to a power of two, at least 256).
  explicit CallHistory(size_t keep);

  // Collective #seq, unrecorded. One caller at a time: the group calls it while it holds the
  // lock it numbers calls under (as the recorder's FlightRecorder::called does).
  void called(uint32_t seq, const CollectiveCall& call);
  // By the thread that ran collective #seq (the group runs one at a time).
  void finished(uint32_t seq) {
    if (seq > last_finished_.load(std::memory_order_relaxed))
      last_finished_.store(seq, std::memory_order_release);
  }
  // "called all_reduce(f32, 1024, sum) and completed it", "has not called collective #9 yet
  // (its last was #8, barrier())".
  std::string describe(uint32_t seq) const;
  // The first collective this rank has not completed (running, queued, failed or not called
  // yet): the group runs them in order.
  uint32_t first_unfinished() const;
  // What this rank called as collective #seq, while it is among the last kept.
  std::optional<CollectiveCall> call(uint32_t seq) const;

  // The flight recorder's state of a call; kUnrecorded for a call it left out (a muted group's).
  enum class State : uint8_t { kQueued, kRunning, kCompleted, kFailed, kUnrecorded };

 private:
  friend class FlightRecorder;  // writes and reads the recorder's fields
  // One call, a cache line. A seqlock: seq is 0 (empty) while the entry changes, and set last.
  struct alignas(64) Entry {
    std::atomic<uint32_t> seq{0};
    std::atomic<uint32_t> site{0};            // the recorder's PythonSite
    std::atomic<uint64_t> head{0}, count{0};  // the call (CollectiveCall::head)
    std::atomic<const void*> caller{nullptr};
    std::atomic<const char*> algorithm{nullptr};  // static storage
    std::atomic<int64_t> enqueued_ns{0};
    // Microseconds after enqueued_ns, plus one; 0 until it happens.
    std::atomic<uint32_t> started_us{0}, ended_us{0};
    std::atomic<int32_t> tid{0};  // the thread that called
    std::atomic<State> state{State::kUnrecorded};
  };
  static_assert(sizeof(Entry) == 64);
  Entry& entry(uint32_t seq) { return entries_[seq & mask_]; }
  const Entry& entry(uint32_t seq) const { return entries_[seq & mask_]; }
  // Empties collective #seq's entry and writes the call; publish() sets it once the rest is in.
  Entry& open(uint32_t seq, const CollectiveCall& call) {
    constexpr auto r = std::memory_order_relaxed;
    Entry& e = entry(seq);
    e.seq.store(0, r);
    std::atomic_thread_fence(std::memory_order_release);
    e.head.store(call.head(), r);
    e.count.store(call.count, r);
    return e;
  }
  void publish(Entry& e, uint32_t seq) {
    e.seq.store(seq, std::memory_order_release);
    if (seq > last_called_.load(std::memory_order_relaxed))
      last_called_.store(seq, std::memory_order_release);
  }
  uint32_t last_called() const { return last_called_.load(std::memory_order_acquire); }

  const uint32_t mask_;
  std::unique_ptr<Entry[]> entries_;  // collective #s at s & mask_
  std::atomic<uint32_t> last_called_{0};
  std::atomic<uint32_t> last_finished_{0};
};

}  // namespace dtrain::comm
