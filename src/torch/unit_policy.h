// UnitPolicy: what ShardedDataParallel does with one unit beyond sharding its optimizer state.
// Users choose a ZeRO stage (ShardingOptions::stage, numbered as DeepSpeed numbers them); the
// code asks about the behaviour a stage implies, so each unit carries the policy read from the
// stage once. FSDP2 states the same choice per module (fully_shard's reshard_after_forward).
//
//   stage   shard_gradients   reshard_parameters
//     1           no                 no
//     2           yes                no
//     3           yes                yes
//
// Internal to dtrain_torch.
#pragma once

#include "dtrain/torch/sharded_data_parallel.h"

namespace dtrain {

struct UnitPolicy {
  // After its reduce-scatter the unit's whole flat gradient is freed and only this rank's shard
  // of it remains; otherwise the whole gradient stays allocated between steps, zeroed.
  bool shard_gradients = false;
  // The unit's parameters are released after its forward and its backward, and gathered again
  // before each use; otherwise they stay whole and are gathered again only after a step.
  bool reshard_parameters = false;
  // Gathering this unit first starts the gather of the unit computed after it (in forward the
  // next one; in backward, where the parameters are resharded, the one before), so that it
  // travels while this one computes.
  bool prefetch = false;
};

// Stages outside 1-3 are refused at construction, once every rank has agreed; they map like
// their neighbours so that reading the policy never throws before that agreement.
inline UnitPolicy unit_policy(const ShardingOptions& options) {
  return {.shard_gradients = options.stage >= 2,
          .reshard_parameters = options.stage >= 3,
          .prefetch = options.prefetch};
}

}  // namespace dtrain
