// How a group splits into parts for the hierarchical collectives
// (algorithms/allreduce_hierarchical.cc): by host, else by rack, where that is worth it (two
// parts or more, one of them with two ranks or more). Arithmetic on the ranks' hosts and racks
// only, the same on every rank and tested without sockets (tests/comm/hierarchy_plan_test.cc);
// NativeProcessGroup::build_hierarchy makes the groups it says.
#pragma once

#include <string>
#include <vector>

#include "comm/cost_model.h"

namespace dtrain::comm {

// How a group may split its ranks: by host (else by rack, where each host holds one of its
// ranks), by rack only (the cross groups of a split by host), or not at all (the parts
// themselves).
enum class Split { kHostsOrRacks, kRacks, kNone };

struct HierarchyPlan {
  bool spans_racks = false;  // the group's ranks sit in more than one rack (split or not)
  // Empty when the group does not split; else its group ranks per part, the parts in order of
  // their first rank.
  std::vector<std::vector<int>> parts;
  Topology::Level level = Topology::Level::kHosts;
  bool uniform = true;   // every part holds as many ranks
  int per_part = 1;      // ranks in the largest part
  bool in_order = true;  // the parts hold ranks 0, 1, 2, ... in turn
  // Of every group rank: its part and its index in it.
  std::vector<int> part, index;
  int my_part = 0, my_index = 0;  // the calling rank's
  // The calling rank's cross group: the ranks with its index in every part (uniform), or the
  // parts' first ranks (uneven; empty on the other ranks); `cross_index` names it.
  std::vector<int> cross;
  int cross_index = 0;
  // Split by host: the racks of the group and the most hosts in one of them (for the cost
  // model of the cross groups, which split by rack).
  int racks = 1, hosts_per_rack = 1;
};

// `hosts[i]` and `racks[i]`: group rank i's host and rack; `rank`: the calling rank.
HierarchyPlan plan_hierarchy(const std::vector<std::string>& hosts,
                             const std::vector<std::string>& racks, int rank, Split split);

}  // namespace dtrain::comm
