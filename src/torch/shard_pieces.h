// A sharded run's state as pieces: "elements [start, start + count) of parameter p, held by rank
// q", with the optimizer's state of those elements beside them (why pieces rather than flat
// shards: sharded_checkpoint.cc). What the sharded checkpoints (files) and the sharded snapshots
// (memory) share: which pieces a rank holds, the manifest entry listing every rank's pieces, and
// filling a rank's shards, at any world size, from the pieces of a state saved at another.
// Internal to dtrain_torch.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "dtrain/torch/sharded_data_parallel.h"

namespace torch::optim {
class Optimizer;
}

namespace dtrain::shard_pieces {

using Json = nlohmann::ordered_json;

// Elements [lo, hi) of unit u's flat buffer that parameter i has and rank q owns, if any.
std::optional<std::pair<int64_t, int64_t>> overlap(const ShardedUnit& unit, size_t i, int q);

// The names the shards' optimizer state goes under: shard u is "unit.u".
std::map<const void*, std::string> shard_names(const std::vector<at::Tensor>& shards);

// Rank `rank`'s pieces as 1-D views of the shards and of `state` (the optimizer's state under
// shard_names, from optimizer_state::snapshot_optimizer): `<param>` and
// `optimizer.<param>.<state>` for every parameter its shards overlap.
std::map<std::string, at::Tensor> pieces_of(const std::vector<ShardedUnit>& units,
                                            const std::vector<at::Tensor>& shards,
                                            const std::map<std::string, at::Tensor>& state,
                                            int rank);

// The manifest's "parameters" for a world of n: each parameter's name, shape, pieces
// ([rank, first element, count]), its optimizer state's names and the optimizer's step.
Json parameters_entry(const std::vector<ShardedUnit>& units,
                      const std::map<std::string, at::Tensor>& state, int n);

// Every parameter of `model` (name, shape) is in `parameters` with its shape, and nothing else
// is; InvalidArgumentError listing what is not, in `what` ("sharded checkpoint DIR/step-N").
void check_fits(const Json& parameters,
                const std::vector<std::pair<std::string, std::vector<int64_t>>>& model,
                const std::string& what);
// The model's (name, shape) of every parameter of the units.
std::vector<std::pair<std::string, std::vector<int64_t>>> unit_parameters(
    const std::vector<ShardedUnit>& units);

// The optimizer entry optimizer_state::restore_optimizer expects, for `opt`'s parameters under
// `names`, with the saved type and hyper-parameters (`saved`: {"type", "options"}).
Json optimizer_entry(const Json& saved, const torch::optim::Optimizer& opt,
                     const std::map<const void*, std::string>& names, const std::string& what);

// Fills this rank's shards (and their optimizer state) from the pieces of a state saved at any
// world size, one saved rank at a time, so that a caller need hold only one rank's pieces.
class ShardFiller {
 public:
  // piece(key, count): saved rank q's tensor `key`, which must have `count` elements.
  using Piece = std::function<at::Tensor(const std::string& key, int64_t count)>;

  // parameters: the saved manifest's "parameters"; units and rank: this rank's layout now.
  ShardFiller(const Json& parameters, const std::vector<ShardedUnit>& units, int rank,
              bool with_optimizer, std::string what);
  // Whether saved rank q holds elements this rank's shards need.
  bool needs(int q) const;
  void fill(int q, const Piece& piece);
  // The shards (one flat tensor per unit) and the optimizer state under shard_names (each
  // unit's step included); InvalidArgumentError when the pieces filled did not cover them.
  void finish(std::vector<at::Tensor>& shards, std::map<std::string, at::Tensor>& state);

 private:
  struct Need {  // elements [a, b) of parameter `param`, at `local` in unit u's shard
    size_t unit;
    std::string param;
    int64_t local, a, b, filled = 0;
    std::vector<std::array<int64_t, 3>> pieces;  // [rank, start, count]
  };
  std::string what_;
  std::vector<Need> needs_;
  std::vector<at::Tensor> shards_;
  std::vector<std::map<std::string, at::Tensor>> states_;  // per unit: state name -> tensor
  std::vector<std::optional<int64_t>> steps_;              // per unit: the optimizer's step
};

}  // namespace dtrain::shard_pieces
