// Post-mortem of a failed collective: every rank that hears of the failure writes what it
// called as that collective into the store, and the ranks that failed read everyone's entries
// back, so the error says "ranks 0, 1, 3 called broadcast(f32, 4096, root 0); rank 2 called
// all_reduce(f32, 1024, sum)" instead of only naming the connection that broke. Costs nothing
// until something fails.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "comm/collective.h"
#include "dtrain/store.h"

namespace dtrain::comm {

// The store key of rank `rank`'s statement on collective #seq of `group`.
std::string postmortem_key(const std::string& group, uint32_t seq, int rank);

// The recent collectives of one group on this rank. Recording costs a few stores (no lock):
// every collective records its call and its end.
class CallHistory {
 public:
  // One caller at a time: the group calls it while it holds the lock it numbers calls under.
  void called(uint32_t seq, const CollectiveCall& call);
  // By the thread that ran collective #seq (the group runs one at a time).
  void finished(uint32_t seq);
  // "called all_reduce(f32, 1024, sum) and completed it", "has not called collective #9 yet
  // (its last was #8, barrier())".
  std::string describe(uint32_t seq) const;
  // The first collective this rank has not completed (running, queued, failed or not called
  // yet): the group runs them in order.
  uint32_t first_unfinished() const;
  // What this rank called as collective #seq, while it is among the last kKeep.
  std::optional<CollectiveCall> call(uint32_t seq) const;

 private:
  static constexpr size_t kKeep = 256;
  // A seqlock: seq is 0 (empty) while the call changes, and set last.
  struct Entry {
    std::atomic<uint32_t> seq{0};
    std::atomic<uint64_t> head{0}, count{0};  // the call (CollectiveCall::head)
  };
  std::array<Entry, kKeep> calls_{};  // collective #s at s % kKeep: the last kKeep calls
  std::atomic<uint32_t> last_called_{0};
  std::atomic<uint32_t> last_finished_{0};
};

// Writes this rank's entry for collective `seq` of `group`.
void publish_postmortem(Store& store, const std::string& group, int rank, uint32_t seq,
                        const std::string& entry);
// Reads every rank's entry (waiting at most `wait` for missing ones, but not for ranks whose
// connection `lost` describes, nor for ranks that wrote about another collective: they will never
// write about this one) and groups the ranks by what they did:
// "ranks 0, 2: called ...; rank 1: called ...; rank 3: gone (its connection broke)". `lost(r)`
// says why rank r's connection is down ("gone (its connection broke)", or that it did not
// answer within the limit), or nothing while it is up.
using LostConnection = std::function<std::optional<std::string>(int rank)>;
std::string collect_postmortem(Store& store, const std::string& group, int size, uint32_t seq,
                               std::chrono::milliseconds wait, const LostConnection& lost = {});

}  // namespace dtrain::comm
