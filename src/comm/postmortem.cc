#include "comm/postmortem.h"

#include <map>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/deadline.h"

namespace dtrain::comm {
namespace {

std::string latest_key(const std::string& group, int rank) {
  return fmt::format("{}/postmortem/latest/{}", group, rank);
}

}  // namespace

std::string postmortem_key(const std::string& group, uint32_t seq, int rank) {
  return fmt::format("{}/postmortem/{}/{}", group, seq, rank);
}

void publish_postmortem(Store& store, const std::string& group, int rank, uint32_t seq,
                        const std::string& entry) {
  try {
    store.set(postmortem_key(group, seq, rank), std::string_view(entry));
    // Also as this rank's latest word, for a post-mortem of another collective number (ranks
    // that time out in different collectives at once still learn where the others are).
    store.set(latest_key(group, rank), fmt::format("at collective #{} {}", seq, entry));
  } catch (const std::exception&) {
    // The store may be gone with the failure; the error keeps its proximate cause.
  }
}

std::string collect_postmortem(Store& store, const std::string& group, int size, uint32_t seq,
                               std::chrono::milliseconds wait, const LostConnection& lost) {
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(postmortem_key(group, seq, r));
  const Deadline deadline = Deadline::after(wait);
  std::map<std::string, std::vector<int>> by_entry;
  std::vector<int> silent;
  std::map<std::string, std::vector<int>> down;  // why their connection is down -> ranks
  // Whether some rank that may still write has not written yet. A rank whose latest word is for
  // another collective will not: it wrote once, for the collective it failed in (a group fails
  // once), having completed this one or not reached it; its latest word says which.
  auto waiting = [&] {
    for (int r = 0; r < size; ++r)
      if (!store.check({keys[r]}) && !store.check({latest_key(group, r)}) && !(lost && lost(r)))
        return true;
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
      else if (auto why = lost ? lost(r) : std::nullopt)
        down[*why].push_back(r);
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
  for (const auto& [why, rs] : down) parts.push_back(fmt::format("{}: {}", ranks(rs), why));
  if (!silent.empty())
    parts.push_back(fmt::format("{}: no word within {} (stuck elsewhere, or gone)", ranks(silent),
                                deadline.describe()));
  return fmt::format("collective #{} of group {}, rank by rank: {}", seq, group,
                     fmt::join(parts, "; "));
}

}  // namespace dtrain::comm
