// The implementations `dtrain bench --peers` times beside dtrain, as recipes: each says what it
// needs here (and, when that is missing, why it is skipped) and which processes one run of it
// starts. The peers themselves are bench/peers/ (gloo_peer.cc and mpi_peer.cc, built beside
// `dtrain` by bench/CMakeLists.txt, and torch_peer.py); they take bench::to_peer_args' flags and
// print bench_common's result lines. Adding a peer is its program there and one entry in the
// table of bench_peers.cc; `--peers` accepts the table's names. (bench/peers/torch_nccl_peer.py
// is not one: it times torch's NCCL on a GPU beside bench/gpu_bench.cc, run by
// scripts/gpu_check.sh.)
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/store.h"
#include "tools/dtrain/bench_child.h"
#include "tools/dtrain/emulated_cluster.h"

namespace dtrain::tools {

// What a recipe builds from.
struct PeerSetup {
  std::string name;                        // as asked for: "mpi-tcp" and "mpi" share a recipe
  int np = 0;                              // ranks
  std::optional<EmulatedCluster> cluster;  // --netns: where the ranks run
  std::filesystem::path bin_dir;           // the running dtrain's, which holds the C++ peers
  std::vector<std::string> peer_args;      // bench::to_peer_args: what to time, for every peer
};

// A short run that must succeed before the peer's ranks start, bounded by its own deadline.
struct PeerProbe {
  ChildSpec child;
  double deadline_s = 0;
  std::string failed;  // why the peer is skipped when the probe fails
};

// One run of a peer: its processes, and the store of ours they meet at, if they need one; it
// serves until the run is over.
struct PeerRun {
  std::vector<ChildSpec> children;
  std::unique_ptr<TcpStoreServer> store;
};

struct PeerRecipe {
  std::string_view name;
  // Why the peer cannot run here (said as "NAME: skipped, WHY"), or nullopt when it can.
  std::optional<std::string> (*missing)(const PeerSetup& setup);
  // The probe to pass first, or nullopt; null for a peer that needs none.
  std::optional<PeerProbe> (*probe)(const PeerSetup& setup);
  // Called once `missing` found nothing and the probe passed.
  PeerRun (*start)(const PeerSetup& setup);
};

// Every peer, in the order `--peers` lists them in its help.
std::span<const PeerRecipe> peer_recipes();

// The recipe called `name`, or null.
const PeerRecipe* find_peer(std::string_view name);

// "gloo, mpi, mpi-tcp" followed by `last_separator` and "torch".
std::string peer_names(std::string_view last_separator);

}  // namespace dtrain::tools
