#include "comm/call_history.h"

#include <algorithm>
#include <bit>

#include <fmt/format.h>

namespace dtrain::comm {

CallHistory::CallHistory(size_t keep)
    : mask_(static_cast<uint32_t>(std::bit_ceil(std::max<size_t>(keep, 256)) - 1)),
      entries_(std::make_unique<Entry[]>(size_t{mask_} + 1)) {}

void CallHistory::called(uint32_t seq, const CollectiveCall& call) {
  Entry& e = open(seq, call);
  e.state.store(State::kUnrecorded, std::memory_order_relaxed);
  publish(e, seq);
}

uint32_t CallHistory::first_unfinished() const {
  return last_finished_.load(std::memory_order_acquire) + 1;
}

std::optional<CollectiveCall> CallHistory::call(uint32_t seq) const {
  if (seq == 0) return std::nullopt;
  const Entry& e = entry(seq);
  if (e.seq.load(std::memory_order_acquire) != seq) return std::nullopt;
  const CollectiveCall c = CollectiveCall::from_head(e.head.load(std::memory_order_relaxed),
                                                     e.count.load(std::memory_order_relaxed));
  std::atomic_thread_fence(std::memory_order_acquire);
  if (e.seq.load(std::memory_order_relaxed) != seq) return std::nullopt;  // overwritten meanwhile
  return c;
}

std::string CallHistory::describe(uint32_t seq) const {
  if (auto c = call(seq))
    return fmt::format(
        "called {}{}", c->describe(),
        seq <= last_finished_.load(std::memory_order_acquire) ? " and completed it" : "");
  const uint32_t last = last_called();
  if (last == 0) return fmt::format("has not called collective #{} (nor any before it)", seq);
  const auto latest = call(last);
  const std::string what = latest ? latest->describe() : std::string("being recorded");
  if (seq < last)
    return fmt::format(
        "called collective #{} too long ago to say what it was (its last was #{}, "
        "{})",
        seq, last, what);
  return fmt::format("has not called collective #{} yet (its last was #{}, {})", seq, last, what);
}

}  // namespace dtrain::comm
