// Int8 and bf16 encodings, written as scalar loops that the compiler vectorises (as reduce.cc):
// a full block has a constant trip count, so GCC's -O2 vectorises it without a scalar remainder;
// the block's largest magnitude is an integer maximum over the values' bits with the sign cleared
// (for non-negative floats the integer order is the float order, and infinities and NaNs compare
// above every finite value, so one comparison finds them too); rounding to nearest even adds and
// subtracts 1.5 * 2^23, exact for the magnitudes up to 127 that reach it. Each function is built
// for AVX-512, AVX2 and baseline x86-64, chosen at load time.
#include "common/quantize.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>

#include "common/reduce.h"
#include "common/vector_clones.h"

namespace dtrain {
namespace {

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfinityBits = 0x7f800000u;
constexpr float kRounder = 12582912.0f;  // 1.5 * 2^23

// One block of `len` values (kQuantBlock, or fewer at the end): `out` gets the scale, then the
// int8 values. Two passes: the values (with the error added) and their largest magnitude, then
// the rounding, the bytes and the new error. __restrict: the int8 stores would otherwise be
// assumed to alias the floats, which keeps the loops scalar.
inline DTRAIN_INLINE void encode_block(const float* __restrict x, float* __restrict error,
                                       size_t len, std::byte* __restrict out) {
  float v[kQuantBlock];
  uint32_t largest = 0;
  if (error != nullptr) {
    for (size_t i = 0; i < len; ++i) {
      v[i] = x[i] + error[i];
      const uint32_t a = std::bit_cast<uint32_t>(v[i]) & kAbsMask;
      largest = a > largest ? a : largest;
    }
  } else {
    for (size_t i = 0; i < len; ++i) {
      v[i] = x[i];
      const uint32_t a = std::bit_cast<uint32_t>(v[i]) & kAbsMask;
      largest = a > largest ? a : largest;
    }
  }
  auto* __restrict q = reinterpret_cast<int8_t*>(out + sizeof(float));
  float scale = 0;
  const float amax = std::bit_cast<float>(largest);
  const float inverse = 127.0f / amax;
  if (largest >= kInfinityBits) {
    scale = std::numeric_limits<float>::quiet_NaN();
    std::memset(q, 0, len);
    if (error != nullptr) std::fill(error, error + len, 0.0f);
  } else if (!(inverse < std::numeric_limits<float>::infinity())) {
    // Zeros, or values too small for a finite inverse: nothing is sent; the error keeps them.
    std::memset(q, 0, len);
    if (error != nullptr) std::copy(v, v + len, error);
  } else {
    scale = amax / 127.0f;
    if (error != nullptr) {
      for (size_t i = 0; i < len; ++i) {
        const float r = (v[i] * inverse + kRounder) - kRounder;
        q[i] = static_cast<int8_t>(static_cast<int32_t>(r));
        error[i] = v[i] - r * scale;
      }
    } else {
      for (size_t i = 0; i < len; ++i) {
        const float r = (v[i] * inverse + kRounder) - kRounder;
        q[i] = static_cast<int8_t>(static_cast<int32_t>(r));
      }
    }
  }
  std::memcpy(out, &scale, sizeof scale);
}

inline DTRAIN_INLINE void decode_block(const std::byte* __restrict in, size_t len,
                                       float* __restrict out, bool accumulate) {
  float scale;
  std::memcpy(&scale, in, sizeof scale);
  const auto* __restrict q = reinterpret_cast<const int8_t*>(in + sizeof scale);
  if (accumulate) {
    for (size_t i = 0; i < len; ++i) out[i] += static_cast<float>(q[i]) * scale;
  } else {
    for (size_t i = 0; i < len; ++i) out[i] = static_cast<float>(q[i]) * scale;
  }
}

inline DTRAIN_INLINE void encode_bf16_block(const float* __restrict x, float* __restrict error,
                                            size_t len, uint16_t* __restrict out) {
  if (error == nullptr) {
    for (size_t i = 0; i < len; ++i) out[i] = f32_to_bf16_bits(x[i]);
    return;
  }
  for (size_t i = 0; i < len; ++i) {
    const float v = x[i] + error[i];
    const uint16_t h = f32_to_bf16_bits(v);
    out[i] = h;
    const bool finite = (std::bit_cast<uint32_t>(v) & kInfinityBits) != kInfinityBits;
    error[i] = finite ? v - bf16_bits_to_f32(h) : 0.0f;
  }
}

inline DTRAIN_INLINE void decode_bf16_block(const uint16_t* __restrict in, size_t len,
                                            float* __restrict out, bool accumulate) {
  if (accumulate) {
    for (size_t i = 0; i < len; ++i) out[i] += bf16_bits_to_f32(in[i]);
  } else {
    for (size_t i = 0; i < len; ++i) out[i] = bf16_bits_to_f32(in[i]);
  }
}

constexpr size_t kBlockBytes = quantized_bytes(kQuantBlock);

}  // namespace

DTRAIN_CLONES void quantize_int8(const float* in, float* error, size_t n, std::byte* out) {
  size_t b = 0;
  for (; b + kQuantBlock <= n; b += kQuantBlock, out += kBlockBytes)
    encode_block(in + b, error ? error + b : nullptr, kQuantBlock, out);
  if (b < n) encode_block(in + b, error ? error + b : nullptr, n - b, out);
}

DTRAIN_CLONES void dequantize_int8(const std::byte* in, size_t n, float* out, bool accumulate) {
  size_t b = 0;
  for (; b + kQuantBlock <= n; b += kQuantBlock, in += kBlockBytes)
    decode_block(in, kQuantBlock, out + b, accumulate);
  if (b < n) decode_block(in, n - b, out + b, accumulate);
}

DTRAIN_CLONES void encode_bf16(const float* in, float* error, size_t n, std::byte* out) {
  auto* to = reinterpret_cast<uint16_t*>(out);
  size_t b = 0;
  for (; b + kQuantBlock <= n; b += kQuantBlock)
    encode_bf16_block(in + b, error ? error + b : nullptr, kQuantBlock, to + b);
  if (b < n) encode_bf16_block(in + b, error ? error + b : nullptr, n - b, to + b);
}

DTRAIN_CLONES void decode_bf16(const std::byte* in, size_t n, float* out, bool accumulate) {
  const auto* from = reinterpret_cast<const uint16_t*>(in);
  size_t b = 0;
  for (; b + kQuantBlock <= n; b += kQuantBlock)
    decode_bf16_block(from + b, kQuantBlock, out + b, accumulate);
  if (b < n) decode_bf16_block(from + b, n - b, out + b, accumulate);
}

}  // namespace dtrain
