// Cutting a model into pipeline stages: contiguous parts of a list of per-module costs (parameter
// counts, measured times) whose largest part is the least possible. The C++ runner's
// balance_by_parameters/balance_by_time (dtrain/torch/pipeline.h) and Python's
// dtrain.pipeline.balance use this one.
#pragma once

#include <cstddef>
#include <vector>

namespace dtrain::pipeline {

// Cut points: part k holds items cuts[k] .. cuts[k+1]-1 (cuts[0] = 0, cuts.back() = the item
// count), each part at least one item. Of the many cuts that reach the least largest part, each
// part is filled from the left as far as that bound allows, so items that cost nothing
// (activations, Flatten) join the part before them. Throws InvalidArgumentError when there are
// fewer items than parts.
std::vector<size_t> balance(const std::vector<double>& costs, int parts);

}  // namespace dtrain::pipeline
