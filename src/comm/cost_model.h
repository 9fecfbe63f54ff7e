// The cost model that picks a collective's algorithm from the message size and the group's
// shape, in the alpha-beta-gamma model: alpha seconds per message, beta per byte sent, gamma per
// byte reduced, for each class of link a group's messages cross (shared memory inside a host,
// the network between hosts, a rack's uplink between racks). Constants come from defaults
// measured on loopback, a calibration file (DTRAIN_COST_FILE, written by `dtrain bench allreduce
// --calibrate`) or the environment; DTRAIN_ALGO and the options' `algorithm` override the choice.
// `dtrain predict` (comm/scaling_model.h) prices whole training steps with the same formulas.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "comm/collective.h"

namespace dtrain::comm {

namespace algo {
struct Algorithm;
struct CostInput;
}  // namespace algo

// What one message costs on one class of link.
struct LinkCost {
  double alpha = 0;  // seconds per message
  double beta = 0;   // seconds per byte of one flow (a host's NIC, a rack's uplink: shared)
};

struct CostConstants {
  double alpha = 12e-6;         // between hosts: seconds per message
  double beta = 1.0 / 4.0e9;    // ... seconds per byte on the wire
  double gamma = 1.0 / 12.0e9;  // seconds per byte reduced
  // A group whose ranks all share a host (shared memory): messages and copies are cheaper.
  double alpha_local = 2e-6;
  double beta_local = 1.0 / 10.0e9;
  // Between racks, through a rack's uplink that every flow leaving the rack shares. 0 = as
  // between hosts.
  double alpha_rack = 0;
  double beta_rack = 0;
  // Seconds per byte of all the TCP flows together of hosts that share one machine's cores
  // (emulated hosts, containers of one node), where the kernel's copies and the virtual links'
  // work bind before the links do. 0 = none measured: each flow as fast as its link.
  double beta_machine = 0;
  // The same for shared memory: seconds per byte (as the hierarchy's formula counts them) of
  // its steps inside the hosts, a reduce-scatter and an all-gather beyond the cache, with every
  // host of the machine running them at once. 0 = none measured: each host's memory and cores
  // its own.
  double beta_machine_shm = 0;
  // What one collective call costs beyond its messages: the hand-over to the group's executor
  // and back to the waiting caller. The hierarchical forms pay it for each inner collective.
  double call = 20e-6;
  // The last-level cache (sysfs, else 32 MiB; at most 4 MiB per CPU of the machine): algorithms
  // that pass data through the shared-memory rings are fast while every rank's buffer stays in
  // it, and pay for each copy through memory beyond it, where one-copy "direct" wins.
  double cache_bytes = 32.0 * 1024 * 1024;

  LinkCost shm() const { return {alpha_local, beta_local}; }
  LinkCost host() const { return {alpha, beta}; }
  LinkCost rack() const {
    return {alpha_rack > 0 ? alpha_rack : alpha, beta_rack > 0 ? beta_rack : beta};
  }
};

// What the group's connections can do, which changes the costs and the candidates. A group
// spread over several hosts (or, for the hierarchy's cross groups, racks) is split into "parts"
// at its level: the ranks of one host (rack) each.
struct Topology {
  enum class Level { kHosts, kRacks };
  bool local = false;         // every peer on shared memory
  bool can_read_all = false;  // ... and readable with cross-memory attach ("direct")
  Level level = Level::kHosts;
  int hosts = 1;        // parts at this level; > 1 with >= 2 ranks in some: "hierarchical"
  int per_host = 1;     // ranks per part (the most, where uneven)
  bool uniform = true;  // every part holds per_host ranks (else hierarchical runs by leaders)
  bool host_contiguous = false;   // part h holds ranks h*k .. h*k+k-1
  int racks = 1;                  // (level kHosts) racks the hosts sit in, > 1 when told
  int hosts_per_rack = 1;         // ... hosts in each (the most)
  bool spans_racks = false;       // some messages cross a rack's uplink
  int nic_sharers = 1;            // groups that run at once over the same links (the hierarchy's
                                  // cross groups: one per local index), dividing their bandwidth
  double oversubscription = 1.0;  // ranks on this host per core, at least 1
  bool one_machine = false;       // every rank on one machine's cores (beta_machine applies)
};

// The cost file, or why it could not be used.
struct LoadedConstants {
  CostConstants constants;
  std::string problem;  // "" = fine; else the file named by DTRAIN_COST_FILE is unusable: why
};

class CostModel {
 public:
  explicit CostModel(CostConstants constants = load().constants);
  // Defaults, then DTRAIN_COST_FILE, then DTRAIN_COST_ALPHA_US / _BETA_GBPS / _GAMMA_GBPS.
  // A missing or corrupt file is not thrown: `problem` says what is wrong with it.
  static LoadedConstants load();
  // Reads a calibration file; throws InvalidArgumentError naming the file and the fault.
  static CostConstants read_file(const std::string& path, CostConstants defaults = {});
  // The same for the file's text; `where` names it in errors.
  static CostConstants parse(const std::string& text, const std::string& where,
                             CostConstants defaults = {});
  // The file `dtrain bench --calibrate` writes (JSON; `note` says where it was measured).
  static std::string to_json(const CostConstants& k, const std::string& note);

  // Estimated seconds of the algorithm `name` of `kind` for `bytes` per rank over `n` ranks.
  double cost(std::string_view name, CollectiveKind kind, size_t bytes, int n,
              const Topology& topology = {}) const;
  double cost(const algo::Algorithm& a, size_t bytes, int n, const Topology& topology = {}) const;
  // The cheapest of the algorithms of `kind` (comm/algorithms/algorithm.h) that can run here.
  const algo::Algorithm& pick(CollectiveKind kind, size_t bytes, int n,
                              const Topology& topology = {}) const;
  // Its cost.
  double best_cost(CollectiveKind kind, size_t bytes, int n, const Topology& topology = {}) const;
  // Resolves an explicit request ("" = none) against DTRAIN_ALGO and the model; throws
  // InvalidArgumentError for a name `kind` does not have, listing the ones it has, or for one
  // the group's shape does not allow (algo::unusable says why).
  const algo::Algorithm& choose(CollectiveKind kind, std::string_view requested, size_t bytes,
                                int n, const Topology& topology = {}) const;

  // The topology of the hierarchy's cross groups of a group with `t`: one rank per host, k of
  // them at once; themselves split by rack where the hosts sit in several.
  static Topology cross_of(const Topology& t);

  const CostConstants& constants() const { return k_; }
  void set_constants(const CostConstants& k) { k_ = k; }

 private:
  double hierarchical(CollectiveKind kind, double bytes, int n, const Topology& t) const;
  // What a flat algorithm's formula is given for this group (its links, flows and cache).
  algo::CostInput input(const algo::Algorithm& a, size_t bytes, int n,
                        const Topology& topology) const;
  CostConstants k_;
  std::string algo_env_;  // DTRAIN_ALGO, read once
};

}  // namespace dtrain::comm
