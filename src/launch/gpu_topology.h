// Which GPUs of a node each local rank gets, from the node's topology (`nvidia-smi topo -m`):
// the GPUs of one rank as close as they can be (NVLink, then the same PCIe switch, then the same
// host bridge, then the same NUMA node, then across sockets), and each rank's CPUs on its GPUs'
// NUMA node. `dtrain run --gpus-per-proc G` sets CUDA_VISIBLE_DEVICES and the CPU binding from it.
#pragma once

#include <string>
#include <vector>

namespace dtrain::launch {

struct GpuTopology {
  // How GPU i reaches GPU j, best first: NV<n> (n bonded NVLinks) > PIX (one PCIe switch) > PXB
  // (several switches) > PHB (a host bridge) > NODE (host bridges of one NUMA node) > SYS
  // (across sockets). link[i][i] is "X".
  std::vector<std::vector<std::string>> link;
  std::vector<std::vector<int>> cpus;  // each GPU's CPU affinity (empty: unknown)
  std::vector<int> numa;               // each GPU's NUMA node (-1: unknown)
  int gpus() const { return static_cast<int>(link.size()); }
};

// Parses the matrix `nvidia-smi topo -m` prints (the GPU rows; NIC rows and columns and the
// legend are skipped). Throws InvalidArgumentError naming the line it cannot read.
GpuTopology parse_nvidia_smi_topo(const std::string& text);

// The higher, the closer: NV<n> = 100 + n, PIX 50, PXB 40, PHB 30, NODE 20, SYS 10.
int link_score(const std::string& link);

// `ranks` disjoint sets of `per_rank` GPUs: each set the closest group left (the highest weakest
// link, then the highest sum), sets taken in order of closeness, GPUs within a set ascending.
// Throws InvalidArgumentError when the node has fewer than ranks x per_rank GPUs.
std::vector<std::vector<int>> pick_gpu_sets(const GpuTopology& topology, int ranks, int per_rank);

// "0-3,8" -> {0,1,2,3,8}; throws InvalidArgumentError for anything else.
std::vector<int> parse_cpu_list(const std::string& text);

}  // namespace dtrain::launch
