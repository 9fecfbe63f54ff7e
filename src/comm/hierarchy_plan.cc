#include "comm/hierarchy_plan.h"

#include <algorithm>

namespace dtrain::comm {
namespace {

// Group ranks by key, the parts in order of their first rank.
std::vector<std::vector<int>> split_by(const std::vector<std::string>& keys_of_ranks) {
  std::vector<std::string> keys;
  std::vector<std::vector<int>> parts;
  for (size_t i = 0; i < keys_of_ranks.size(); ++i) {
    auto it = std::find(keys.begin(), keys.end(), keys_of_ranks[i]);
    if (it == keys.end()) {
      keys.push_back(keys_of_ranks[i]);
      parts.emplace_back();
      it = keys.end() - 1;
    }
    parts[it - keys.begin()].push_back(static_cast<int>(i));
  }
  return parts;
}

bool worth_it(const std::vector<std::vector<int>>& parts) {
  size_t most = 0;
  for (const auto& p : parts) most = std::max(most, p.size());
  return parts.size() >= 2 && most >= 2;
}

}  // namespace

HierarchyPlan plan_hierarchy(const std::vector<std::string>& hosts,
                             const std::vector<std::string>& racks, int rank, Split split) {
  HierarchyPlan plan;
  const int size = static_cast<int>(hosts.size());
  if (size < 2) return plan;
  const auto by_rack = split_by(racks);
  plan.spans_racks = by_rack.size() > 1;
  if (split == Split::kNone) return plan;
  std::vector<std::vector<int>> parts;
  if (split == Split::kHostsOrRacks) parts = split_by(hosts);
  if (!worth_it(parts)) {
    parts = by_rack;
    plan.level = Topology::Level::kRacks;
  }
  if (!worth_it(parts)) {
    plan.level = Topology::Level::kHosts;
    return plan;
  }

  plan.part.assign(size, 0);
  plan.index.assign(size, 0);
  size_t most = 0;
  for (const auto& p : parts) {
    plan.uniform &= p.size() == parts[0].size();
    most = std::max(most, p.size());
  }
  plan.per_part = static_cast<int>(most);
  int next = 0;
  for (size_t p = 0; p < parts.size(); ++p)
    for (size_t j = 0; j < parts[p].size(); ++j) {
      const int r = parts[p][j];
      if (r == rank) plan.my_part = static_cast<int>(p), plan.my_index = static_cast<int>(j);
      plan.part[r] = static_cast<int>(p);
      plan.index[r] = static_cast<int>(j);
      plan.in_order &= r == next++;
    }

  if (plan.uniform) {
    for (const auto& p : parts) plan.cross.push_back(p[plan.my_index]);
    plan.cross_index = plan.my_index;
  } else if (plan.my_index == 0) {
    for (const auto& p : parts) plan.cross.push_back(p[0]);
  }

  if (plan.level == Topology::Level::kHosts) {
    std::vector<std::string> rack_of_part;
    for (const auto& p : parts) rack_of_part.push_back(racks[p[0]]);
    std::sort(rack_of_part.begin(), rack_of_part.end());
    int run = 0;
    for (size_t i = 0; i < rack_of_part.size(); ++i) {
      run = i > 0 && rack_of_part[i] == rack_of_part[i - 1] ? run + 1 : 1;
      plan.hosts_per_rack = std::max(plan.hosts_per_rack, run);
    }
    plan.racks = static_cast<int>(by_rack.size());
  }
  plan.parts = std::move(parts);
  return plan;
}

}  // namespace dtrain::comm
