// F32 values encoded in fewer bytes, for collectives that send fewer (ZeRO++'s qgZ and 1-bit
// Adam's compressed all-reduce are the models):
//   int8: blocks of kQuantBlock values, each an f32 scale (the block's largest magnitude / 127)
//         followed by one int8 per value: 1 + 4 / kQuantBlock bytes a value instead of 4;
//   int4: likewise with the scale the largest magnitude / 7 and 4 bits a value from -7 to 7, two
//         to a byte (the lower half first): 1/2 + 4 / kQuantBlock bytes a value;
//   bf16: each value rounded to bfloat16 (to nearest even): 2 bytes, 8 significant bits;
//   fp16: each value rounded to IEEE half precision: 2 bytes, 11 significant bits, magnitudes
//         from 6e-8 (smaller ones become zero) to 65504 (larger ones become infinite).
//
// Error feedback: what rounding loses is not dropped but carried into the next call. With an
// `error` buffer, quantize() encodes x + error and leaves in error what that encoding lost, which
// the caller hands back with the next values (the compressed SGD of Seide et al. and Karimireddy
// et al.: the sum of what was sent tracks the sum of the values).
//
// An int8 or int4 block holding an infinity or a NaN is sent with a NaN scale, so every value of it
// arrives as NaN (a loss scaler sees the overflow) and its error is reset to zero; bf16 and fp16
// carry infinities and NaNs as themselves (fp16 also a finite value it cannot hold, as an
// infinity), with an error of zero.
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

// Bytes that n values take as int4 (every block but the last has an even count, so only the last
// can end in half a byte).
constexpr size_t int4_bytes(size_t n) {
  return (n + kQuantBlock - 1) / kQuantBlock * sizeof(float) + (n + 1) / 2;
}
void quantize_int4(const float* in, float* error, size_t n, std::byte* out);
void dequantize_int4(const std::byte* in, size_t n, float* out, bool accumulate);

constexpr size_t bf16_bytes(size_t n) { return 2 * n; }
// As above, in bf16 (out: bf16_bytes(n), 2-byte aligned).
void encode_bf16(const float* in, float* error, size_t n, std::byte* out);
void decode_bf16(const std::byte* in, size_t n, float* out, bool accumulate);

constexpr size_t fp16_bytes(size_t n) { return 2 * n; }
void encode_fp16(const float* in, float* error, size_t n, std::byte* out);
void decode_fp16(const std::byte* in, size_t n, float* out, bool accumulate);

}  // namespace dtrain
