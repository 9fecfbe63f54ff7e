// The int8 all-reduce, in two direct exchanges (the form of ZeRO++'s qgZ, which requantizes once
// where a ring would round again at every hop):
//
//   1. The values are cut into N segments of whole blocks; rank r owns segment r. Each rank
//      quantizes segment p (plus its error feedback) and sends it to rank p, as soon as it is
//      encoded, while it keeps its own segment exact.
//   2. The owner adds the N - 1 decoded copies to its own, divides for an average, quantizes the
//      result (plus its own error feedback for that segment) and sends it to every rank.
//   3. Every rank, the owner too, decodes every segment from the same bytes, so all end with the
//      same values.
//
// The error buffer serves both roundings: a rank's own segment is never rounded on its way in,
// so its slots hold the error of rounding that segment's result instead.
//
// Cost: 2 (N-1) alpha + 2 (N-1)/N M' beta, M' = M (1 + 4/256) / 4 for M bytes of f32, against
// 2 (N-1)/N M beta for the exact ring; plus three passes over the values to encode and decode.
#include "comm/quantized_allreduce.h"

#include <algorithm>
#include <vector>

#include "common/quantize.h"

namespace dtrain::comm {
namespace {

// Segment p: blocks [blocks * p / n, blocks * (p + 1) / n), as elements and as encoded bytes.
struct Segments {
  size_t count, blocks;
  int n;
  size_t first_block(int p) const {
    return blocks * static_cast<size_t>(p) / static_cast<size_t>(n);
  }
  size_t begin(int p) const { return std::min(count, first_block(p) * kQuantBlock); }
  size_t size(int p) const { return begin(p + 1) - begin(p); }
  // Every segment but the last is whole blocks, so its bytes start at a whole block's.
  size_t offset(int p) const { return first_block(p) * quantized_bytes(kQuantBlock); }
  size_t bytes(int p) const { return quantized_bytes(size(p)); }
};

}  // namespace

void quantized_allreduce(CollectiveContext& ctx, float* data, float* error, size_t count,
                         bool average) {
  const int n = ctx.size(), r = ctx.rank();
  if (n == 1 || count == 0) return;
  const Segments seg{count, (count + kQuantBlock - 1) / kQuantBlock, n};
  // The whole buffer encoded (sent in step 1, received in step 2), and the N copies of this
  // rank's segment that step 1 brings.
  std::byte* wire = ctx.scratch(quantized_bytes(count));
  std::byte* copies = ctx.workspace(seg.bytes(r) * static_cast<size_t>(n));
  auto err = [&](int p) { return error != nullptr ? error + seg.begin(p) : nullptr; };

  std::vector<CollectiveContext::RequestPtr> reqs;
  reqs.reserve(2 * static_cast<size_t>(n));
  for (int p = 0; p < n; ++p)
    if (p != r) reqs.push_back(ctx.recv(p, copies + seg.bytes(r) * p, seg.bytes(r)));
  // Starting after this rank spreads the first segments' arrivals over the owners.
  for (int k = 1; k < n; ++k) {
    const int p = (r + k) % n;
    quantize_int8(data + seg.begin(p), err(p), seg.size(p), wire + seg.offset(p));
    reqs.push_back(ctx.send(p, wire + seg.offset(p), seg.bytes(p)));
  }
  ctx.wait(reqs);
  reqs.clear();

  float* mine = data + seg.begin(r);
  for (int p = 0; p < n; ++p)
    if (p != r) dequantize_int8(copies + seg.bytes(r) * p, seg.size(r), mine, true);
  if (average) {
    const float inverse = 1.0f / static_cast<float>(n);
    for (size_t i = 0; i < seg.size(r); ++i) mine[i] *= inverse;
  }
  quantize_int8(mine, err(r), seg.size(r), wire + seg.offset(r));

  for (int p = 0; p < n; ++p)
    if (p != r) reqs.push_back(ctx.recv(p, wire + seg.offset(p), seg.bytes(p)));
  for (int p = 0; p < n; ++p)
    if (p != r) reqs.push_back(ctx.send(p, wire + seg.offset(r), seg.bytes(r)));
  ctx.wait(reqs);
  dequantize_int8(wire, count, data, false);
}

}  // namespace dtrain::comm
