// Int8, int4, bf16 and fp16 encodings, written as scalar loops that the compiler vectorises (as
// reduce.cc): a full block has a constant trip count, so GCC's -O2 vectorises it without a scalar
// remainder; the block's largest magnitude is an integer maximum over the values' bits with the
// sign cleared (for non-negative floats the integer order is the float order, and infinities and
// NaNs compare above every finite value, so one comparison finds them too); rounding to nearest
// even adds and subtracts 1.5 * 2^23, exact for the magnitudes up to 127 that reach it; int4 is
// int8's rounding to 7 levels, its integers then packed two to a byte. Each function is built for
// AVX-512, AVX2 and baseline x86-64, chosen at load time.
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

// One block of `len` values (kQuantBlock, or fewer at the end) rounded to integers from -kLevels
// to kLevels times the returned scale, into q. Two passes: the values (with the error added) and
// their largest magnitude, then the rounding, the integers and the new error. __restrict: the
// int8 stores would otherwise be assumed to alias the floats, which keeps the loops scalar.
template <int kLevels>
inline DTRAIN_INLINE float round_block(const float* __restrict x, float* __restrict error,
                                       size_t len, int8_t* __restrict q) {
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
  float scale = 0;
  const float amax = std::bit_cast<float>(largest);
  const float inverse = kLevels / amax;
  if (largest >= kInfinityBits) {
    scale = std::numeric_limits<float>::quiet_NaN();
    std::memset(q, 0, len);
    if (error != nullptr) std::fill(error, error + len, 0.0f);
  } else if (!(inverse < std::numeric_limits<float>::infinity())) {
    // Zeros, or values too small for a finite inverse: nothing is sent; the error keeps them.
    std::memset(q, 0, len);
    if (error != nullptr) std::copy(v, v + len, error);
  } else {
    scale = amax / kLevels;
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
  return scale;
}

// `out` gets the scale, then the int8 values.
inline DTRAIN_INLINE void encode_block(const float* __restrict x, float* __restrict error,
                                       size_t len, std::byte* __restrict out) {
  const float scale =
      round_block<127>(x, error, len, reinterpret_cast<int8_t*>(out + sizeof scale));
  std::memcpy(out, &scale, sizeof scale);
}

// `out` gets the scale, then the values two to a byte, the lower half first.
inline DTRAIN_INLINE void encode_int4_block(const float* __restrict x, float* __restrict error,
                                            size_t len, std::byte* __restrict out) {
  int8_t q[kQuantBlock];
  const float scale = round_block<7>(x, error, len, q);
  std::memcpy(out, &scale, sizeof scale);
  auto* __restrict packed = reinterpret_cast<uint8_t*>(out + sizeof scale);
  for (size_t i = 0; i < len / 2; ++i)
    packed[i] = static_cast<uint8_t>((q[2 * i] & 0xf) | (q[2 * i + 1] << 4));
  if (len % 2 != 0) packed[len / 2] = static_cast<uint8_t>(q[len - 1] & 0xf);
}

inline DTRAIN_INLINE void decode_int4_block(const std::byte* __restrict in, size_t len,
                                            float* __restrict out, bool accumulate) {
  float scale;
  std::memcpy(&scale, in, sizeof scale);
  const auto* __restrict packed = reinterpret_cast<const uint8_t*>(in + sizeof scale);
  // A nibble's sign spreads from its top bit: shifted to the byte's top, then back.
  auto low = [](uint8_t b) DTRAIN_INLINE { return static_cast<int8_t>(b << 4) >> 4; };
  auto high = [](uint8_t b) DTRAIN_INLINE { return static_cast<int8_t>(b) >> 4; };
  const size_t pairs = len / 2;
  if (accumulate) {
    for (size_t i = 0; i < pairs; ++i) {
      out[2 * i] += static_cast<float>(low(packed[i])) * scale;
      out[2 * i + 1] += static_cast<float>(high(packed[i])) * scale;
    }
    if (len % 2 != 0) out[len - 1] += static_cast<float>(low(packed[pairs])) * scale;
  } else {
    for (size_t i = 0; i < pairs; ++i) {
      out[2 * i] = static_cast<float>(low(packed[i])) * scale;
      out[2 * i + 1] = static_cast<float>(high(packed[i])) * scale;
    }
    if (len % 2 != 0) out[len - 1] = static_cast<float>(low(packed[pairs])) * scale;
  }
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
constexpr size_t kInt4BlockBytes = int4_bytes(kQuantBlock);

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

DTRAIN_CLONES void quantize_int4(const float* in, float* error, size_t n, std::byte* out) {
  size_t b = 0;
  for (; b + kQuantBlock <= n; b += kQuantBlock, out += kInt4BlockBytes)
    encode_int4_block(in + b, error ? error + b : nullptr, kQuantBlock, out);
  if (b < n) encode_int4_block(in + b, error ? error + b : nullptr, n - b, out);
}

DTRAIN_CLONES void dequantize_int4(const std::byte* in, size_t n, float* out, bool accumulate) {
  size_t b = 0;
  for (; b + kQuantBlock <= n; b += kQuantBlock, in += kInt4BlockBytes)
    decode_int4_block(in, kQuantBlock, out + b, accumulate);
  if (b < n) decode_int4_block(in, n - b, out + b, accumulate);
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

// fp16 goes through reduce.h's conversions (F16C where the CPU has it), a block at a time through
// arrays that stay in the first-level cache, so that the error and the sum are part of the same
// pass over the values.
DTRAIN_CLONES void encode_fp16(const float* in, float* error, size_t n, std::byte* out) {
  auto* to = reinterpret_cast<uint16_t*>(out);
  if (error == nullptr) return f32_to_f16(in, to, n);
  float v[kQuantBlock], back[kQuantBlock];
  for (size_t b = 0; b < n; b += kQuantBlock) {
    const size_t len = std::min(kQuantBlock, n - b);
    for (size_t i = 0; i < len; ++i) v[i] = in[b + i] + error[b + i];
    f32_to_f16(v, to + b, len);
    f16_to_f32(to + b, back, len);
    for (size_t i = 0; i < len; ++i) {
      const bool finite = (std::bit_cast<uint32_t>(back[i]) & kInfinityBits) != kInfinityBits;
      error[b + i] = finite ? v[i] - back[i] : 0.0f;
    }
  }
}

DTRAIN_CLONES void decode_fp16(const std::byte* in, size_t n, float* out, bool accumulate) {
  const auto* from = reinterpret_cast<const uint16_t*>(in);
  if (!accumulate) return f16_to_f32(from, out, n);
  float v[kQuantBlock];
  for (size_t b = 0; b < n; b += kQuantBlock) {
    const size_t len = std::min(kQuantBlock, n - b);
    f16_to_f32(from + b, v, len);
    for (size_t i = 0; i < len; ++i) out[b + i] += v[i];
  }
}

}  // namespace dtrain
