#include "ps/optimizer.h"

#include <algorithm>
#include <cmath>

namespace dtrain::ps {

size_t state_per_weight(OptimizerOptions::Kind kind) {
  switch (kind) {
    case OptimizerOptions::Kind::kMomentum:
      return 1;
    case OptimizerOptions::Kind::kAdam:
      return 2;
    case OptimizerOptions::Kind::kAdagrad:
      return 1;
    case OptimizerOptions::Kind::kSgd:
    case OptimizerOptions::Kind::kSum:
      return 0;
  }
  return 0;
}

const char* to_string(OptimizerOptions::Kind kind) {
  switch (kind) {
    case OptimizerOptions::Kind::kSgd:
      return "sgd";
    case OptimizerOptions::Kind::kMomentum:
      return "momentum";
    case OptimizerOptions::Kind::kAdam:
      return "adam";
    case OptimizerOptions::Kind::kAdagrad:
      return "adagrad";
    case OptimizerOptions::Kind::kSum:
      return "sum";
  }
  return "unknown";
}

void init_state(const OptimizerOptions& o, float* state, size_t n) {
  const size_t k = state_per_weight(o.kind);
  if (k == 0) return;
  const float first = o.kind == OptimizerOptions::Kind::kAdagrad ? o.initial_accumulator : 0.0f;
  std::fill(state, state + n, first);
  if (k > 1) std::fill(state + n, state + k * n, 0.0f);
}

// Plain loops over restrict pointers: the compiler vectorises them (-O2 -march flags of the
// build); the server's cost is dominated by memory bandwidth, not arithmetic.
void apply_update(const OptimizerOptions& o, float* __restrict w, float* __restrict state,
                  const float* __restrict g, size_t n, float scale, uint64_t t) {
  const float lr = o.lr, wd = o.weight_decay;
  switch (o.kind) {
    case OptimizerOptions::Kind::kSum:
      for (size_t i = 0; i < n; ++i) w[i] += scale * g[i];
      return;
    case OptimizerOptions::Kind::kSgd:
      for (size_t i = 0; i < n; ++i) w[i] -= lr * (scale * g[i] + wd * w[i]);
      return;
    case OptimizerOptions::Kind::kMomentum: {
      const float mu = o.momentum;
      float* __restrict v = state;
      // torch.optim.SGD: the first step sets the buffer to the gradient itself.
      if (t == 1) {
        for (size_t i = 0; i < n; ++i) {
          v[i] = scale * g[i] + wd * w[i];
          w[i] -= lr * v[i];
        }
      } else {
        for (size_t i = 0; i < n; ++i) {
          v[i] = mu * v[i] + (scale * g[i] + wd * w[i]);
          w[i] -= lr * v[i];
        }
      }
      return;
    }
    case OptimizerOptions::Kind::kAdam: {
      float* __restrict m = state;
      float* __restrict v = state + n;
      const float b1 = o.beta1, b2 = o.beta2, eps = o.eps;
      const float c1 = 1.0f - std::pow(b1, static_cast<float>(t));
      const float c2 = std::sqrt(1.0f - std::pow(b2, static_cast<float>(t)));
      const float step = lr / c1;
      for (size_t i = 0; i < n; ++i) {
        float gi = scale * g[i] + wd * w[i];
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        w[i] -= step * m[i] / (std::sqrt(v[i]) / c2 + eps);
      }
      return;
    }
    case OptimizerOptions::Kind::kAdagrad: {
      float* __restrict acc = state;
      const float eps = o.eps;
      for (size_t i = 0; i < n; ++i) {
        float gi = scale * g[i] + wd * w[i];
        acc[i] += gi * gi;
        w[i] -= lr * gi / (std::sqrt(acc[i]) + eps);
      }
      return;
    }
  }
}

}  // namespace dtrain::ps
