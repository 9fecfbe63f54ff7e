// Tensor contents for collective tests: typed reads and writes of byte buffers in every dtype,
// the reference reduction over ranks, and a comparison that names the first wrong element.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/reduce.h"
#include "dtrain/reduce_op.h"
#include "dtrain/tensor.h"

namespace dtrain::testing {

// Counts that take the awkward paths: empty, one, a prime, not a multiple of n, and 4 MiB of f32.
inline std::vector<size_t> counts_for(int n) {
  return {0, 1, 7, static_cast<size_t>(n) * 13 + 1, (size_t{1} << 20) + 3};
}

// A value small enough that sums, products, averages of up to 8 ranks are exact in every dtype
// (bf16 included).
inline int small(int rank, size_t i) { return static_cast<int>((rank + i) % 3) + 1; }

// Writes v into element i of a buffer of dtype t.
inline void put(std::vector<std::byte>& buf, DType t, size_t i, double v) {
  std::byte* p = buf.data() + i * element_size(t);
  switch (t) {
    case DType::kF32: { float x = static_cast<float>(v); std::memcpy(p, &x, 4); break; }
    case DType::kF64: std::memcpy(p, &v, 8); break;
    case DType::kF16: { uint16_t h = f32_to_f16_bits(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
    case DType::kBF16: { uint16_t h = f32_to_bf16_bits(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
    case DType::kI8: { int8_t x = static_cast<int8_t>(v); std::memcpy(p, &x, 1); break; }
    case DType::kU8: { uint8_t x = static_cast<uint8_t>(v); std::memcpy(p, &x, 1); break; }
    case DType::kI16: { int16_t x = static_cast<int16_t>(v); std::memcpy(p, &x, 2); break; }
    case DType::kI32: { int32_t x = static_cast<int32_t>(v); std::memcpy(p, &x, 4); break; }
    case DType::kI64: { int64_t x = static_cast<int64_t>(v); std::memcpy(p, &x, 8); break; }
  }
}

inline double get(const std::vector<std::byte>& buf, DType t, size_t i) {
  const std::byte* p = buf.data() + i * element_size(t);
  switch (t) {
    case DType::kF32: { float x; std::memcpy(&x, p, 4); return x; }
    case DType::kF64: { double x; std::memcpy(&x, p, 8); return x; }
    case DType::kF16: { uint16_t h; std::memcpy(&h, p, 2); return f16_bits_to_f32(h); }
    case DType::kBF16: { uint16_t h; std::memcpy(&h, p, 2); return bf16_bits_to_f32(h); }
    case DType::kI8: { int8_t x; std::memcpy(&x, p, 1); return x; }
    case DType::kU8: { uint8_t x; std::memcpy(&x, p, 1); return x; }
    case DType::kI16: { int16_t x; std::memcpy(&x, p, 2); return x; }
    case DType::kI32: { int32_t x; std::memcpy(&x, p, 4); return x; }
    case DType::kI64: { int64_t x; std::memcpy(&x, p, 8); return static_cast<double>(x); }
  }
  return 0;
}

inline bool is_float(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kF16 || t == DType::kBF16;
}

// The reduction over ranks 0..n-1 of small(r, i), as dtype t holds it (f16 and bf16 round 9/5).
inline double expected_reduction(ReduceOp op, DType t, int n, size_t i) {
  double acc = small(0, i);
  int64_t bits = small(0, i);
  for (int r = 1; r < n; ++r) {
    const int v = small(r, i);
    switch (op) {
      case ReduceOp::kSum: case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProd: acc *= v; break;
      case ReduceOp::kMin: acc = std::min<double>(acc, v); break;
      case ReduceOp::kMax: acc = std::max<double>(acc, v); break;
      case ReduceOp::kBand: bits &= v; break;
      case ReduceOp::kBor: bits |= v; break;
      case ReduceOp::kBxor: bits ^= v; break;
    }
  }
  if (op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor) return static_cast<double>(bits);
  if (op == ReduceOp::kAvg) acc = is_float(t) ? acc / n : std::trunc(acc / n);
  std::vector<std::byte> one(element_size(t));
  put(one, t, 0, acc);
  return get(one, t, 0);
}

inline TensorView view(std::vector<std::byte>& b, DType t) {
  return TensorView{b.data(), b.size() / element_size(t), t};
}

// Compares the first `count` elements and throws with the first difference.
inline void check_values(const std::vector<std::byte>& got, DType t, size_t count,
                         const std::function<double(size_t)>& want, const std::string& what) {
  for (size_t i = 0; i < count; ++i) {
    const double g = get(got, t, i), w = want(i);
    if (g != w && !(std::fabs(g - w) <= 1e-6 * std::fabs(w)))
      throw std::runtime_error(fmt::format("{}: element {} is {} but should be {}", what, i, g, w));
  }
}

}  // namespace dtrain::testing
