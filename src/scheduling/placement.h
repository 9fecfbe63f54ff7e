// Where a job's GPUs go on the cluster: the shape of the cluster, and the placement policies.
//   pack:   best fit. A job that fits on one node goes to the fullest node that holds it; a
//           larger one takes the emptiest nodes first and puts its remainder on the fullest node
//           that holds it, within one rack when a rack can hold it all (the rack with the least
//           to spare). Free GPUs stay together for large jobs, and small jobs share nodes.
//   spread: worst fit. Each GPU block goes to the emptiest node, so that jobs share nodes as
//           little as they can (less interference while the cluster has room); a job that needs
//           several nodes stays in the rack with the most free GPUs when one holds it. With one
//           rack this is the placement of the Tiresias baseline in Pollux's simulator.
//   auto:   spread while the GPUs that active jobs ask for fit in the cluster (below
//           `auto_load` of its GPUs), pack once they do not.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dtrain::scheduling {

struct ClusterSpec {
  int nodes = 16;          // Pollux's simulated cluster: 16 nodes
  int gpus_per_node = 4;   // of 4 GPUs each
  int nodes_per_rack = 0;  // nodes behind one top-of-rack switch; 0: all nodes in one rack
  // GPU models, node by node: each node's model and its speed relative to the GPUs the traces
  // were measured on (empty: every node 1.0). A job runs at the speed of its slowest node.
  std::vector<std::string> node_model;
  std::vector<double> node_speed;
  int total_gpus() const { return nodes * gpus_per_node; }
  double speed_of(int node) const { return node_speed.empty() ? 1.0 : node_speed[node]; }
  int rack_of(int node) const { return nodes_per_rack > 0 ? node / nodes_per_rack : 0; }
};

enum class Placement { kPack, kSpread, kAuto };
Placement placement_from_string(std::string_view name);  // "pack", "spread", "auto"
std::string_view to_string(Placement p);

// The nodes of a job's `gpus` GPUs (one entry per GPU, in the order taken), taken from `free`
// (free GPUs per node, updated). `how` is pack or spread (auto is resolved by the caller).
// Empty, with `free` unchanged, when fewer than `gpus` GPUs are free.
std::vector<int> place(const ClusterSpec& cluster, std::vector<int>& free, int gpus, Placement how);

}  // namespace dtrain::scheduling
