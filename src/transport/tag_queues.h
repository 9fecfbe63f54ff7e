// TagQueues: first-in first-out queues keyed by message tag, as one flat list in arrival order.
//
// A pair holds a handful of posted receives and early messages at a time, and a collective
// uses a fresh tag each time: a hash map of deques would allocate a node, a map and a block
// for every collective and free them again; a short linear scan costs less.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace dtrain::transport {

template <typename T>
class TagQueues {
 public:
  struct Entry {
    uint64_t tag;
    T value;
  };

  // The oldest entry with `tag`, or null.
  T* front(uint64_t tag) {
    for (auto& e : entries_)
      if (e.tag == tag) return &e.value;
    return nullptr;
  }
  // Removes the oldest entry with `tag` and returns it; `tag` must have one (see front()).
  T take_front(uint64_t tag) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->tag == tag) {
        T value = std::move(it->value);
        entries_.erase(it);
        return value;
      }
    return T{};
  }
  void push_back(uint64_t tag, T value) { entries_.push_back({tag, std::move(value)}); }
  // Removes every entry for which pred(tag, value) is true, keeping the others' order.
  template <typename Pred>
  void remove_if(Pred pred) {
    std::erase_if(entries_, [&](Entry& e) { return pred(e.tag, e.value); });
  }
  bool empty() const { return entries_.empty(); }
  void clear() { entries_.clear(); }
  auto begin() { return entries_.begin(); }
  auto end() { return entries_.end(); }

 private:
  std::vector<Entry> entries_;
};

}  // namespace dtrain::transport
