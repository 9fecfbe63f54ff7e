#include "data/epoch_order.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace dtrain::data {
namespace {

// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and fully specified.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound), without modulo bias (Lemire 2019).
  uint64_t below(uint64_t bound) {
    unsigned __int128 m = static_cast<unsigned __int128>(next()) * bound;
    auto low = static_cast<uint64_t>(m);
    if (low < bound) {
      const uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(next()) * bound;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  uint64_t state_;
};

// A seed for one use of the generator: (seed, epoch, what) mixed so that neighbours differ.
uint64_t mix(uint64_t seed, uint64_t epoch, uint64_t what) {
  SplitMix64 g(seed ^ 0x6a09e667f3bcc909ull);
  uint64_t s = g.next() ^ (epoch * 0xd1b54a32d192ed03ull);
  SplitMix64 h(s);
  return h.next() ^ (what * 0x8cb92ba72f3d8dd7ull);
}

template <typename T>
void shuffle_in_place(std::vector<T>& v, uint64_t seed) {
  SplitMix64 g(seed);
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[g.below(i)]);
}

}  // namespace

EpochOrder::EpochOrder(std::vector<uint64_t> counts, uint64_t seed, uint64_t epoch, bool shuffle,
                       uint64_t window)
    : counts_(std::move(counts)),
      seed_(seed),
      epoch_(epoch),
      window_(std::max<uint64_t>(window, 1)),
      shuffle_(shuffle) {
  if (window_ > UINT32_MAX) throw std::invalid_argument("EpochOrder: window above 2^32 records");
  first_.resize(counts_.size());
  for (size_t s = 0; s < counts_.size(); ++s) {
    first_[s] = total_;
    total_ += counts_[s];
  }
  shard_order_.resize(counts_.size());
  std::iota(shard_order_.begin(), shard_order_.end(), size_t{0});
  if (shuffle_) shuffle_in_place(shard_order_, mix(seed_, epoch_, UINT64_MAX));
  stream_start_.resize(counts_.size());
  uint64_t at = 0;
  for (size_t k = 0; k < shard_order_.size(); ++k) {
    stream_start_[k] = at;
    at += counts_[shard_order_[k]];
  }
}

uint64_t EpochOrder::stream_id(uint64_t q) const {
  // The last shard (in the epoch's order) starting at or before q that has records.
  size_t k = static_cast<size_t>(std::upper_bound(stream_start_.begin(), stream_start_.end(), q) -
                                 stream_start_.begin()) -
             1;
  while (counts_[shard_order_[k]] == 0) --k;  // empty shards share their successor's start
  return first_[shard_order_[k]] + (q - stream_start_[k]);
}

uint64_t EpochOrder::at(uint64_t p) {
  if (p >= total_) throw std::out_of_range("EpochOrder::at past the epoch's end");
  if (!shuffle_) return stream_id(p);
  const uint64_t w = p / window_;
  const uint64_t start = w * window_;
  if (w != cached_window_) {
    const uint64_t length = std::min(window_, total_ - start);
    permutation_.resize(length);
    std::iota(permutation_.begin(), permutation_.end(), uint32_t{0});
    shuffle_in_place(permutation_, mix(seed_, epoch_, w));
    cached_window_ = w;
  }
  return stream_id(start + permutation_[p - start]);
}

std::pair<size_t, uint64_t> EpochOrder::locate(uint64_t id) const {
  const size_t s =
      static_cast<size_t>(std::upper_bound(first_.begin(), first_.end(), id) - first_.begin()) - 1;
  size_t k = s;
  while (counts_[k] == 0) --k;  // empty shards share their successor's first id
  return {k, id - first_[k]};
}

}  // namespace dtrain::data
