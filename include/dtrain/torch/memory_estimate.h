// The memory estimate (dtrain/memory_estimate.h) of a LibTorch model: its parameter count, and
// its largest unit as ShardedDataParallel cuts it (the largest child's parameters; the whole
// model when it has no children).
//
//   auto e = dtrain::estimate_memory(*model, {.optimizer = "adam", .world_size = 4,
//                                             .layout = "zero3"});
#pragma once

#include <algorithm>

#include <torch/nn/module.h>

#include "dtrain/memory_estimate.h"

namespace dtrain {

inline MemoryEstimate estimate_memory(const torch::nn::Module& model,
                                      MemoryEstimateOptions options) {
  int64_t total = 0, largest = 0;
  for (const auto& p : model.parameters()) total += p.numel();
  for (const auto& child : model.children()) {
    int64_t n = 0;
    for (const auto& p : child->parameters()) n += p.numel();
    largest = std::max(largest, n);
  }
  options.parameters = total;
  if (options.largest_unit == 0) options.largest_unit = largest > 0 ? largest : total;
  return estimate_memory(options);
}

}  // namespace dtrain
