// SpareBuffers: buffers of delivered early messages, kept for the next ones. A collective whose
// peer runs ahead sends many same-sized messages early, and fresh buffers cost a page fault per
// 4 KiB (the kernel's copies into them took three quarters of a 16 MiB all-reduce's faults).
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

namespace dtrain::transport {

class SpareBuffers {
 public:
  // A buffer of at least `n` bytes (its capacity in `capacity`), uninitialised.
  std::unique_ptr<std::byte[]> take(size_t n, size_t& capacity) {
    // The smallest spare that fits and wastes at most half of itself.
    size_t best = spare_.size();
    for (size_t i = 0; i < spare_.size(); ++i)
      if (spare_[i].first >= n && spare_[i].first / 2 <= n &&
          (best == spare_.size() || spare_[i].first < spare_[best].first))
        best = i;
    if (best == spare_.size()) {
      capacity = n;
      return std::make_unique_for_overwrite<std::byte[]>(n);
    }
    capacity = spare_[best].first;
    std::unique_ptr<std::byte[]> out = std::move(spare_[best].second);
    bytes_ -= capacity;
    spare_[best] = std::move(spare_.back());
    spare_.pop_back();
    return out;
  }

  void give(std::unique_ptr<std::byte[]> bytes, size_t capacity) {
    // Tiny messages are cheap to allocate; huge ones would pin memory.
    if (capacity < 4096 || capacity > kMaxEach || bytes_ + capacity > kMaxBytes) return;
    bytes_ += capacity;
    spare_.emplace_back(capacity, std::move(bytes));
  }

 private:
  static constexpr size_t kMaxBytes = size_t{16} << 20;  // kept in all
  static constexpr size_t kMaxEach = size_t{4} << 20;    // larger ones are freed
  std::vector<std::pair<size_t, std::unique_ptr<std::byte[]>>> spare_;
  size_t bytes_ = 0;
};

}  // namespace dtrain::transport
