// The consistency rules of one unit of a table (a chunk of a dense slice, or a sparse shard):
// how many times each worker pushed to it (its clock), how many synchronous versions have been
// applied, and whether a worker may read now.
//
//   sync     worker w may read once version >= clock[w]: all of its own pushes are applied.
//            Version v is complete when every worker still in the job has pushed it
//            (clock[w'] > v); workers that left cleanly no longer count.
//   async    always.
//   bounded  (SSP, staleness s) once every worker still in the job has clock >= clock[w] - s.
// A worker that died (its connection broke without a goodbye) still counts, marked failed: the
// reads that wait on it fail at once, naming it, instead of hanging.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/ps.h"

namespace dtrain::ps {

class WorkerClocks {
 public:
  enum class Presence : uint8_t { kActive, kLeft, kFailed };

  WorkerClocks(Consistency mode, uint32_t staleness, int workers)
      : mode_(mode), staleness_(staleness), clock_(workers, 0), presence_(workers) {}

  int workers() const { return static_cast<int>(clock_.size()); }
  uint64_t clock(int w) const { return clock_[w]; }
  uint64_t version() const { return version_; }
  Presence presence(int w) const { return presence_[w]; }

  // Counts a push by w; returns the version it contributes to (w's clock before it).
  uint64_t on_push(int w) { return clock_[w]++; }
  // Whether version v can be applied (sync).
  bool complete(uint64_t v) const {
    for (int w = 0; w < workers(); ++w)
      if (presence_[w] != Presence::kLeft && clock_[w] <= v) return false;
    return true;
  }
  void on_applied() { ++version_; }

  // The workers that w's read waits for (empty: it may read now).
  std::vector<int> blockers(int w) const {
    std::vector<int> out;
    if (mode_ == Consistency::kAsync) return out;
    for (int o = 0; o < workers(); ++o) {
      if (presence_[o] == Presence::kLeft) continue;
      bool holds_back = mode_ == Consistency::kSync ? version_ < clock_[w] && clock_[o] <= version_
                                                    : clock_[o] + staleness_ < clock_[w];
      if (holds_back) out.push_back(o);
    }
    return out;
  }

  void set_presence(int w, Presence p) {
    if (w < 0 || w >= workers()) return;
    // A worker that left and comes back starts where the others stand, not where it left: its
    // old clock would make its pushes count for versions long applied.
    if (presence_[w] == Presence::kLeft && p == Presence::kActive) {
      uint64_t floor = version_;
      if (mode_ != Consistency::kSync) {
        floor = UINT64_MAX;
        for (int o = 0; o < workers(); ++o)
          if (o != w && presence_[o] != Presence::kLeft) floor = std::min(floor, clock_[o]);
        if (floor == UINT64_MAX) floor = clock_[w];
      }
      clock_[w] = std::max(clock_[w], floor);
    }
    presence_[w] = p;
  }

  // The pushes of the version in progress are dropped (sync: a step that a worker's death cut
  // short, which the others redo): every clock ahead of the version goes back to it.
  void rewind() {
    for (auto& c : clock_) c = std::min(c, version_);
  }

  // For checkpoints.
  const std::vector<uint64_t>& clocks() const { return clock_; }
  void restore(uint64_t version, const std::vector<uint64_t>& clocks) {
    version_ = version;
    for (size_t i = 0; i < clocks.size() && i < clock_.size(); ++i) clock_[i] = clocks[i];
  }

 private:
  Consistency mode_;
  uint32_t staleness_;
  uint64_t version_ = 0;
  std::vector<uint64_t> clock_;
  std::vector<Presence> presence_;
};

}  // namespace dtrain::ps
