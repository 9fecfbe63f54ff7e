// One process `dtrain bench`'s driver starts (a rank of dtrain or of a peer, or a peer's mpirun),
// and the environment a rank meets its store by, torchrun's way, on this host or on an emulated
// cluster's.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "tools/dtrain/emulated_cluster.h"

namespace dtrain::tools {

struct ChildSpec {
  std::string label;  // "rank 3", "mpirun"
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;  // on top of ours
  std::vector<int> cpus;  // sched_setaffinity before exec; empty = the driver's
  std::string netns;      // the network namespace to run in ("" = the driver's)
};

// RANK, WORLD_SIZE, LOCAL_RANK, ..., the store at 127.0.0.1:`port`, as on one host.
std::vector<std::pair<std::string, std::string>> rank_env(int rank, int np, uint16_t port);

// On an emulated cluster: the rank's host (its namespace), its local rank there, and the store
// at `master` (the driver's, at the head address; torch's, on host 0).
void place(ChildSpec& s, const EmulatedCluster& c, int rank, int np, const std::string& master);

// The running `dtrain`: its ranks run it again, and the C++ peers are built beside it.
std::filesystem::path self_exe();

}  // namespace dtrain::tools
