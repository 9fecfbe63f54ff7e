// Int8 block quantization of f32 values, for collectives that send fewer bytes (ZeRO++'s qgZ and
// 1-bit Adam's compressed all-reduce are the models): values travel in blocks of kQuantBlock, each
// an f32 scale (the block's largest magnitude / 127) followed by one int8 per value, so a value
// costs 1 + 4 / kQuantBlock bytes instead of 4.
//
// Error feedback: what rounding loses is not dropped but carried into the next call. With an
// `error` buffer, quantize() encodes x + error and leaves in error what that encoding lost, which
// the caller hands back with the next values (the compressed SGD of Seide et al. and Karimireddy
// et al.: the sum of what was sent tracks the sum of the values).
//
// A block holding an infinity or a NaN is sent with a NaN scale, so every value of it arrives as
// NaN (a loss scaler sees the overflow) and its error is reset to zero.
#pragma once

#include <cstddef>

namespace dtrain {

inline constexpr size_t kQuantBlock = 256;

// Bytes that n values take quantized.
constexpr size_t quantized_bytes(size_t n) {
  return (n + kQuantBlock - 1) / kQuantBlock * sizeof(float) + n;
}

// Encodes in[0, n) (+ error, when not null) into out (quantized_bytes(n)); error gets what the
// encoding lost. n may end inside a block.
void quantize_int8(const float* in, float* error, size_t n, std::byte* out);
// Decodes n values: out = the values (accumulate false) or out += the values (true).
void dequantize_int8(const std::byte* in, size_t n, float* out, bool accumulate);

}  // namespace dtrain
