// The cost model that picks a collective's algorithm from the message size and group size,
// in the alpha-beta-gamma model: alpha seconds per message, beta per byte sent, gamma per byte
// reduced. Constants come from defaults measured on loopback TCP, a calibration file
// (DTRAIN_COST_FILE, JSON {"alpha_us":..,"beta_gbps":..,"gamma_gbps":..}) or the environment;
// DTRAIN_ALGO and the options' `algorithm` override the choice.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "comm/collective.h"

namespace dtrain::comm {

struct CostConstants {
  double alpha = 12e-6;          // seconds per message
  double beta = 1.0 / 4.0e9;     // seconds per byte on the wire
  double gamma = 1.0 / 12.0e9;   // seconds per byte reduced
  // A group whose ranks all share a host (shared memory): messages and copies are cheaper.
  double alpha_local = 2e-6;
  double beta_local = 1.0 / 10.0e9;
  // The last-level cache (sysfs, else 32 MiB): algorithms that pass data through the
  // shared-memory rings are fast while every rank's buffer stays in it, and pay for each copy
  // through memory beyond it, where one-copy "direct" wins.
  double cache_bytes = 32.0 * 1024 * 1024;
};

// What the group's connections can do, which changes the costs and the candidates.
struct Topology {
  bool local = false;        // every peer on shared memory
  bool can_read_all = false;  // ... and readable with cross-memory attach ("direct")
  int hosts = 1;              // > 1 with the same number of ranks on each: "hierarchical"
  int per_host = 1;
  bool host_contiguous = false;  // host h holds ranks h*k .. h*k+k-1 (hierarchical all-gather)
  double oversubscription = 1.0;  // ranks on this host per core, at least 1
};

class CostModel {
 public:
  explicit CostModel(CostConstants constants = load());
  // Defaults, then DTRAIN_COST_FILE, then DTRAIN_COST_ALPHA_US / _BETA_GBPS / _GAMMA_GBPS.
  static CostConstants load();

  // The algorithms that can run `kind`, the first being the default.
  static std::span<const std::string_view> candidates(CollectiveKind kind);
  // Estimated seconds of `algorithm` for `bytes` per rank over `n` ranks.
  double cost(std::string_view algorithm, CollectiveKind kind, size_t bytes, int n,
              const Topology& topology = {}) const;
  // The cheapest candidate.
  std::string_view pick(CollectiveKind kind, size_t bytes, int n, const Topology& topology = {}) const;
  // Resolves an explicit request ("" = none) against DTRAIN_ALGO and the model; throws
  // InvalidArgumentError for a name `kind` does not have, listing the ones it has (or for
  // "direct" where the topology does not allow it).
  std::string_view choose(CollectiveKind kind, std::string_view requested, size_t bytes, int n,
                          const Topology& topology = {}) const;

  const CostConstants& constants() const { return k_; }

 private:
  CostConstants k_;
  std::string algo_env_;  // DTRAIN_ALGO, read once
};

}  // namespace dtrain::comm
