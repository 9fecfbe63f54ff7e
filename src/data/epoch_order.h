// The order in which an epoch visits the records of a sharded dataset, the same on every rank
// and independent of the number of ranks: the shards in an order drawn from (seed, epoch), their
// records one after the other, and each window of `window` consecutive records of that stream
// permuted, again from (seed, epoch, window). Memory: the shards' counts and one window.
//
// Records are named by global id: the shards in the order given, ids [first, first + count) for
// each. The generator is SplitMix64 with unbiased bounded draws, so the order is the same on any
// platform and compiler (std::uniform_int_distribution is not).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace dtrain::data {

class EpochOrder {
 public:
  EpochOrder(std::vector<uint64_t> counts, uint64_t seed, uint64_t epoch, bool shuffle,
             uint64_t window);

  uint64_t size() const { return total_; }
  // The global id of the record at position p (p < size()). Cheapest for increasing p: one
  // window's permutation is kept.
  uint64_t at(uint64_t p);
  // Which shard holds global id `id`, and its number there.
  std::pair<size_t, uint64_t> locate(uint64_t id) const;

 private:
  uint64_t stream_id(uint64_t q) const;  // the global id at position q of the unshuffled stream

  std::vector<uint64_t> counts_;
  std::vector<uint64_t> first_;         // global id of each shard's first record
  std::vector<size_t> shard_order_;     // the epoch's order of the shards
  std::vector<uint64_t> stream_start_;  // stream position where each shard (in that order) starts
  uint64_t seed_, epoch_, window_, total_ = 0;
  bool shuffle_;
  uint64_t cached_window_ = UINT64_MAX;
  std::vector<uint32_t> permutation_;  // of the cached window
};

}  // namespace dtrain::data
