// The server-side optimizers: one update of n weights from a gradient, with the per-weight state
// each keeps (planar: state[k * n + i] is state k of weight i).
//
//   kSgd       w -= lr * (g + wd * w)
//   kMomentum  v = momentum * v + (g + wd * w); w -= lr * v           (torch.optim.SGD)
//   kAdam      m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//              w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)  (torch.optim.Adam)
//   kAdagrad   G += g^2; w -= lr * g / (sqrt(G) + eps)               (torch.optim.Adagrad)
//   kSum       w += g   (servers only add gradients up; workers run the optimizer)
// g is the gradient times `scale` (1/contributors for a synchronous average); t counts updates
// from 1.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dtrain/ps.h"

namespace dtrain::ps {

size_t state_per_weight(OptimizerOptions::Kind kind);
const char* to_string(OptimizerOptions::Kind kind);

// Sets the state of n fresh weights (zero; Adagrad's initial accumulator).
void init_state(const OptimizerOptions& o, float* state, size_t n);

void apply_update(const OptimizerOptions& o, float* w, float* state, const float* g, size_t n,
                  float scale, uint64_t t);

}  // namespace dtrain::ps
