// Elementwise reduction kernels: the inner loop of every all-reduce, reduce and reduce-scatter.
// Buffers are raw host memory of `count` elements of `dtype`; src/common/reduce.cc says how they
// are vectorised. Every function here is reentrant and allocates nothing.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "dtrain/reduce_op.h"
#include "dtrain/tensor.h"

namespace dtrain {

// dst[i] = dst[i] (op) src[i] for i < count. AVG accumulates like SUM (call scale_down at the end).
// Integer SUM/PROD wrap around (two's complement); f16 and bf16 are computed in f32 and rounded
// to nearest even; MIN/MAX propagate NaN. dst == src is allowed, a partial overlap is not.
void reduce_into(void* dst, const void* src, size_t count, DType dtype, ReduceOp op);

// dst[i] = a[i] (op) b[i]; dst may be a or b (or neither), but must not overlap them partially.
void reduce_to(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op);

// For AVG: data[i] /= divisor (integers truncate toward zero). Throws when divisor is 0.
void scale_down(void* data, size_t count, DType dtype, size_t divisor);

// Throws InvalidArgumentError when op cannot apply to dtype (bitwise ops on floating point).
void check_reduce_op(DType dtype, ReduceOp op);

// Bulk conversions (round to nearest even; NaN stays NaN; overflow gives infinity).
void f32_to_f16(const float* in, uint16_t* out, size_t n);
void f16_to_f32(const uint16_t* in, float* out, size_t n);
void f32_to_bf16(const float* in, uint16_t* out, size_t n);
void bf16_to_f32(const uint16_t* in, float* out, size_t n);

// Scalar conversions in plain bit arithmetic: the portable path of the bulk ones above.
inline float bf16_bits_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }

inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  uint32_t quiet_nan = (x >> 16) | 0x40u;  // a NaN must not round into infinity
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

inline float f16_bits_to_f32(uint16_t h) {
  uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f)  // infinity, or NaN made quiet as F16C does
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa ? 0x400000u | (mantissa << 13) : 0));
  if (exponent == 0)  // zero or subnormal: mantissa * 2^-24, exact in f32
    return std::bit_cast<float>(sign |
                                std::bit_cast<uint32_t>(static_cast<float>(mantissa) * 0x1p-24f));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline uint16_t f32_to_f16_bits(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (abs >= 0x38800000u)  // normal: rebias the exponent (127 -> 15) and round the 13 dropped bits
    return static_cast<uint16_t>(sign | ((abs + 0xc8000fffu + ((abs >> 13) & 1u)) >> 13));
  // Subnormal or zero: adding 0.5 puts the f16 quantum 2^-24 at the last f32 bit, so the FPU
  // rounds.
  float shifted = std::bit_cast<float>(abs) + 0.5f;
  return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(shifted) - 0x3f000000u));
}

}  // namespace dtrain
