#include "scheduling/placement.h"

#include <fmt/format.h>

#include <numeric>

#include "dtrain/error.h"

namespace dtrain::scheduling {

Placement placement_from_string(std::string_view name) {
  if (name == "pack") return Placement::kPack;
  if (name == "spread") return Placement::kSpread;
  if (name == "auto") return Placement::kAuto;
  throw InvalidArgumentError(fmt::format("unknown placement '{}': pack, spread or auto", name));
}

std::string_view to_string(Placement p) {
  switch (p) {
    case Placement::kPack:
      return "pack";
    case Placement::kSpread:
      return "spread";
    case Placement::kAuto:
      return "auto";
  }
  return "?";
}

std::vector<int> place(const ClusterSpec& cluster, std::vector<int>& free, int gpus,
                       Placement how) {
  if (std::accumulate(free.begin(), free.end(), 0) < gpus) return {};
  std::vector<int> nodes;
  auto take = [&](int node, int count) {
    nodes.insert(nodes.end(), count, node);
    free[node] -= count;
    gpus -= count;
  };
  if (how == Placement::kSpread) {
    while (gpus > 0) {
      int best = 0;  // the emptiest node, the lowest index among equals
      for (int n = 1; n < cluster.nodes; ++n)
        if (free[n] > free[best]) best = n;
      take(best, std::min(free[best], gpus));
    }
    return nodes;
  }
  // Pack: within the rack that holds the job with the fewest free GPUs to spare, if any.
  int rack = -1, rack_free = 0;
  const int racks = cluster.nodes_per_rack > 0
                        ? (cluster.nodes + cluster.nodes_per_rack - 1) / cluster.nodes_per_rack
                        : 1;
  for (int r = 0; r < racks; ++r) {
    int f = 0;
    for (int n = 0; n < cluster.nodes; ++n)
      if (cluster.rack_of(n) == r) f += free[n];
    if (f >= gpus && (rack < 0 || f < rack_free)) rack = r, rack_free = f;
  }
  auto eligible = [&](int n) { return free[n] > 0 && (rack < 0 || cluster.rack_of(n) == rack); };
  while (gpus > 0) {
    int fit = -1, emptiest = -1;
    for (int n = 0; n < cluster.nodes; ++n) {
      if (!eligible(n)) continue;
      if (free[n] >= gpus && (fit < 0 || free[n] < free[fit])) fit = n;
      if (emptiest < 0 || free[n] > free[emptiest]) emptiest = n;
    }
    if (fit >= 0) {
      take(fit, gpus);
    } else {
      take(emptiest, free[emptiest]);
    }
  }
  return nodes;
}

}  // namespace dtrain::scheduling
