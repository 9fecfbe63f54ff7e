#include "comm/postmortem.h"

#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/deadline.h"

namespace dtrain::comm {
namespace {

std::string key(const std::string& group, uint32_t seq, int rank) {
  return fmt::format("{}/postmortem/{}/{}", group, seq, rank);
}

std::string latest_key(const std::string& group, int rank) {
  return fmt::format("{}/postmortem/latest/{}", group, rank);
}

}  // namespace

void CallHistory::called(uint32_t seq, const CollectiveCall& call) {
  std::lock_guard lock(mu_);
  calls_[seq] = call;
  while (calls_.size() > kKeep) calls_.erase(calls_.begin());
}

void CallHistory::finished(uint32_t seq) {
  std::lock_guard lock(mu_);
  if (seq > last_finished_) last_finished_ = seq;
}

std::string CallHistory::describe(uint32_t seq) const {
  std::lock_guard lock(mu_);
  auto it = calls_.find(seq);
  if (it == calls_.end()) {
    if (calls_.empty()) return fmt::format("has not called collective #{} (nor any before it)", seq);
    auto last = calls_.rbegin();
    return fmt::format("has not called collective #{} yet (its last was #{}, {})", seq,
                       last->first, last->second.describe());
  }
  return fmt::format("called {}{}", it->second.describe(),
                     seq <= last_finished_ ? " and completed it" : "");
}

void publish_postmortem(Store& store, const std::string& group, int rank, uint32_t seq,
                        const std::string& entry) {
  try {
    store.set(key(group, seq, rank), std::string_view(entry));
    // Also as this rank's latest word, for a post-mortem of another collective number (ranks
    // that time out in different collectives at once still learn where the others are).
    store.set(latest_key(group, rank), fmt::format("at collective #{} {}", seq, entry));
  } catch (const std::exception&) {
    // The store may be gone with the failure; the error keeps its proximate cause.
  }
}

std::string collect_postmortem(Store& store, const std::string& group, int size, uint32_t seq,
                               std::chrono::milliseconds wait,
                               const std::function<bool(int rank)>& gone) {
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(key(group, seq, r));
  const Deadline deadline = Deadline::after(wait);
  std::map<std::string, std::vector<int>> by_entry;
  std::vector<int> silent, dead;
  // Whether some rank that may still write has not written yet.
  auto waiting = [&] {
    for (int r = 0; r < size; ++r)
      if (!store.check({keys[r]}) && !(gone && gone(r))) return true;
    return false;
  };
  try {
    while (!store.check(keys) && !deadline.expired() && waiting())
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (int r = 0; r < size; ++r) {
      if (store.check({keys[r]}))
        by_entry[store.get_string(keys[r])].push_back(r);
      else if (store.check({latest_key(group, r)}))
        by_entry[fmt::format("has no entry for #{}; its latest: {}", seq,
                             store.get_string(latest_key(group, r)))]
            .push_back(r);
      else if (gone && gone(r))
        dead.push_back(r);
      else
        silent.push_back(r);
    }
  } catch (const std::exception& e) {
    return fmt::format("(no post-mortem: the store is unreachable: {})", e.what());
  }
  std::vector<std::string> parts;
  auto ranks = [](const std::vector<int>& v) {
    return fmt::format("{} {}", v.size() == 1 ? "rank" : "ranks", fmt::join(v, ", "));
  };
  for (const auto& [entry, rs] : by_entry) parts.push_back(fmt::format("{} {}", ranks(rs), entry));
  if (!dead.empty()) parts.push_back(fmt::format("{}: gone (its connection broke)", ranks(dead)));
  if (!silent.empty())
    parts.push_back(fmt::format("{}: no word within {} (stuck elsewhere, or gone)", ranks(silent),
                                deadline.describe()));
  return fmt::format("collective #{} of group {}, rank by rank: {}", seq, group,
                     fmt::join(parts, "; "));
}

}  // namespace dtrain::comm
