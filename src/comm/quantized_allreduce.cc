// The all-reduce of f32 values encoded as int8 or int4 blocks, bf16 or fp16, in two direct
// exchanges (the form of ZeRO++'s qgZ, which rounds the sum once where a ring would round again at
// every hop):
//
//   1. The values are cut into N segments of whole blocks; rank r owns segment r. Each rank
//      encodes segment p (plus its error feedback) and sends it to rank p, as soon as it is
//      encoded, while it keeps its own segment exact.
//   2. The owner adds the N - 1 decoded copies to its own, divides for an average, encodes the
//      result (plus its own error feedback for that segment) and sends it to every rank.
//   3. Every rank, the owner too, decodes every segment from the same bytes, so all end with the
//      same values.
//
// The error buffer serves both roundings: a rank's own segment is never rounded on its way in,
// so its slots hold the error of rounding that segment's result instead.
//
// The decoding adds into f32 as the values arrive from each copy: the casts are part of the
// reduction's pass, not passes of their own before and after an exact all-reduce of 16-bit data.
//
// Cost: 2 (N-1) alpha + 2 (N-1)/N M' beta, M' = M (1 + 4/256) / 4 (int8), M (1/2 + 4/256) / 4
// (int4) or M / 2 (bf16, fp16) for M bytes of f32, against 2 (N-1)/N M beta for the exact ring;
// plus about three passes over the values to encode and decode.
#include "comm/quantized_allreduce.h"

#include <algorithm>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/quantize.h"
#include "dtrain/error.h"

namespace dtrain::comm {
namespace {

// How a wire encodes values (common/quantize.h).
struct Codec {
  size_t (*bytes)(size_t n);
  void (*encode)(const float* in, float* error, size_t n, std::byte* out);
  void (*decode)(const std::byte* in, size_t n, float* out, bool accumulate);
};
constexpr Codec kInt8Codec{[](size_t n) { return quantized_bytes(n); }, quantize_int8,
                           dequantize_int8};
constexpr Codec kBf16Codec{[](size_t n) { return bf16_bytes(n); }, encode_bf16, decode_bf16};
constexpr Codec kFp16Codec{[](size_t n) { return fp16_bytes(n); }, encode_fp16, decode_fp16};
constexpr Codec kInt4Codec{[](size_t n) { return int4_bytes(n); }, quantize_int4, dequantize_int4};

const Codec& codec_of(Wire wire) {
  switch (wire) {
    case Wire::kBf16:
      return kBf16Codec;
    case Wire::kFp16:
      return kFp16Codec;
    case Wire::kInt4:
      return kInt4Codec;
    default:
      return kInt8Codec;
  }
}

constexpr std::pair<Wire, std::string_view> kWireNames[] = {{Wire::kExact, "exact"},
                                                            {Wire::kInt8, "int8"},
                                                            {Wire::kBf16, "bf16"},
                                                            {Wire::kFp16, "fp16"},
                                                            {Wire::kInt4, "int4"}};

// Segment p: blocks [blocks * p / n, blocks * (p + 1) / n), as elements and as encoded bytes.
struct Segments {
  const Codec& codec;
  size_t count, blocks;
  int n;
  size_t first_block(int p) const {
    return blocks * static_cast<size_t>(p) / static_cast<size_t>(n);
  }
  size_t begin(int p) const { return std::min(count, first_block(p) * kQuantBlock); }
  size_t size(int p) const { return begin(p + 1) - begin(p); }
  // Every segment but the last is whole blocks, so its encoding starts where the values before
  // it end, encoded.
  size_t offset(int p) const { return codec.bytes(begin(p)); }
  size_t bytes(int p) const { return codec.bytes(size(p)); }
};

}  // namespace

CollectiveKind collective_of(Wire wire) {
  switch (wire) {
    case Wire::kInt8:
      return CollectiveKind::kAllreduceInt8;
    case Wire::kBf16:
      return CollectiveKind::kAllreduceBf16;
    case Wire::kFp16:
      return CollectiveKind::kAllreduceFp16;
    case Wire::kInt4:
      return CollectiveKind::kAllreduceInt4;
    default:
      return CollectiveKind::kAllreduce;
  }
}

void quantized_allreduce(CollectiveContext& ctx, Wire wire, float* data, float* error, size_t count,
                         bool average) {
  const int n = ctx.size(), r = ctx.rank();
  if (n == 1 || count == 0) return;
  const Codec& codec = codec_of(wire);
  const Segments seg{codec, count, (count + kQuantBlock - 1) / kQuantBlock, n};
  // The whole buffer encoded (sent in step 1, received in step 2), and the N copies of this
  // rank's segment that step 1 brings.
  std::byte* encoded = ctx.scratch(codec.bytes(count));
  std::byte* copies = ctx.workspace(seg.bytes(r) * static_cast<size_t>(n));
  auto err = [&](int p) { return error != nullptr ? error + seg.begin(p) : nullptr; };

  std::vector<CollectiveContext::RequestPtr> reqs;
  reqs.reserve(2 * static_cast<size_t>(n));
  for (int p = 0; p < n; ++p)
    if (p != r) reqs.push_back(ctx.recv(p, copies + seg.bytes(r) * p, seg.bytes(r)));
  // Starting after this rank spreads the first segments' arrivals over the owners.
  for (int k = 1; k < n; ++k) {
    const int p = (r + k) % n;
    codec.encode(data + seg.begin(p), err(p), seg.size(p), encoded + seg.offset(p));
    reqs.push_back(ctx.send(p, encoded + seg.offset(p), seg.bytes(p)));
  }
  ctx.wait(reqs);
  reqs.clear();

  float* mine = data + seg.begin(r);
  for (int p = 0; p < n; ++p)
    if (p != r) codec.decode(copies + seg.bytes(r) * p, seg.size(r), mine, true);
  if (average) {
    const float inverse = 1.0f / static_cast<float>(n);
    for (size_t i = 0; i < seg.size(r); ++i) mine[i] *= inverse;
  }
  codec.encode(mine, err(r), seg.size(r), encoded + seg.offset(r));

  for (int p = 0; p < n; ++p)
    if (p != r) reqs.push_back(ctx.recv(p, encoded + seg.offset(p), seg.bytes(p)));
  for (int p = 0; p < n; ++p)
    if (p != r) reqs.push_back(ctx.send(p, encoded + seg.offset(r), seg.bytes(r)));
  ctx.wait(reqs);
  codec.decode(encoded, count, data, false);
}

}  // namespace dtrain::comm

namespace dtrain {

std::string_view to_string(Wire wire) {
  for (const auto& [w, name] : comm::kWireNames)
    if (w == wire) return name;
  return "unknown wire";
}

Wire parse_wire(std::string_view name) {
  for (const auto& [w, text] : comm::kWireNames)
    if (text == name) return w;
  throw InvalidArgumentError(fmt::format(
      "unknown wire format '{}': choose exact, int8, int4, bf16 or fp16 (AllreduceOptions::wire)",
      name));
}

}  // namespace dtrain
