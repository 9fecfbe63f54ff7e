#include "scheduling/placement.h"

#include <numeric>

#include <fmt/format.h>

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
  // The rack that holds a multi-node job (the one with the most free GPUs for spread, the least
  // to spare for pack), or -1 for all nodes: one rack, or none holds it alone.
  const int racks = cluster.nodes_per_rack > 0
                        ? (cluster.nodes + cluster.nodes_per_rack - 1) / cluster.nodes_per_rack
                        : 1;
  auto choose_rack = [&](bool most) {
    int rack = -1, rack_free = 0;
    for (int r = 0; racks > 1 && r < racks; ++r) {
      int f = 0;
      for (int n = 0; n < cluster.nodes; ++n)
        if (cluster.rack_of(n) == r) f += free[n];
      if (f >= gpus && (rack < 0 || (most ? f > rack_free : f < rack_free)))
        rack = r, rack_free = f;
    }
    return rack;
  };
  if (how == Placement::kSpread) {
    int emptiest = 0;  // the lowest index among equals
    for (int n = 1; n < cluster.nodes; ++n)
      if (free[n] > free[emptiest]) emptiest = n;
    const int rack = free[emptiest] >= gpus ? -1 : choose_rack(/*most=*/true);
    while (gpus > 0) {
      int best = -1;
      for (int n = 0; n < cluster.nodes; ++n)
        if (free[n] > 0 && (rack < 0 || cluster.rack_of(n) == rack) &&
            (best < 0 || free[n] > free[best]))
          best = n;
      take(best, std::min(free[best], gpus));
    }
    return nodes;
  }
  // Pack. A job that fits on one node goes to the fullest node that holds it, wherever it is.
  int fit = -1;
  for (int n = 0; n < cluster.nodes; ++n)
    if (free[n] >= gpus && (fit < 0 || free[n] < free[fit])) fit = n;
  if (fit >= 0) {
    take(fit, gpus);
    return nodes;
  }
  // A larger one stays in one rack when a rack can hold it: the one with the least to spare.
  const int rack = choose_rack(/*most=*/false);
  auto eligible = [&](int n) { return free[n] > 0 && (rack < 0 || cluster.rack_of(n) == rack); };
  // The emptiest nodes first (fewest nodes), and the remainder on the fullest node that holds it.
  while (gpus > 0) {
    int rest = -1, emptiest = -1;
    for (int n = 0; n < cluster.nodes; ++n) {
      if (!eligible(n)) continue;
      if (free[n] >= gpus && (rest < 0 || free[n] < free[rest])) rest = n;
      if (emptiest < 0 || free[n] > free[emptiest]) emptiest = n;
    }
    if (rest >= 0) {
      take(rest, gpus);
    } else {
      take(emptiest, free[emptiest]);
    }
  }
  return nodes;
}

}  // namespace dtrain::scheduling
