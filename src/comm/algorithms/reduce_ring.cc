// Ring reduce: a ring reduce-scatter (rank i ends with segment i reduced), then every rank
// sends its segment to the root.
//
// Cost: 2 (N-1) alpha + 2 (N-1)/N M beta + (N-1)/N M gamma, with the root receiving only
// (N-1)/N M: the choice for large buffers, where a tree would move M per round.
#include <vector>

#include "comm/algorithms/algorithm.h"
#include "comm/algorithms/algorithms.h"

namespace dtrain::comm::algo {

void reduce_ring(CollectiveContext& ctx, std::byte* data, size_t count) {
  const int n = ctx.size();
  if (n == 1) return;
  reduce_scatter_ring(ctx, data, count);
  const int root = ctx.call().root;
  const size_t elem = ctx.element_size();
  if (ctx.rank() != root) {
    Segment s = segment(count, n, ctx.rank());
    ctx.wait(ctx.send(root, data + s.offset * elem, s.count * elem));
    return;
  }
  std::vector<CollectiveContext::RequestPtr> recvs;
  for (int i = 0; i < n; ++i) {
    if (i == root) continue;
    Segment s = segment(count, n, i);
    recvs.push_back(ctx.recv(i, data + s.offset * elem, s.count * elem));
  }
  ctx.wait(recvs);
}

extern const Algorithm kReduceRing{
    .name = "ring",
    .kind = CollectiveKind::kReduce,
    .file = "reduce_ring.cc",
    .formula = "2(N-1) alpha + 2(N-1)/N M beta + (N-1)/N M gamma",
    .chosen = "large buffers",
    .flows = Flows::kOnePerHost,
    .cost =
        [](const CostInput& c) {
          return 2 * (c.N - 1) * c.link.alpha + 2 * (c.N - 1) / c.N * c.M * c.link.beta +
                 (c.N - 1) / c.N * c.M * c.gamma;
        },
    .run = [](const Invocation& i) { reduce_ring(i.ctx, bytes_of(i.out), i.out.numel); },
};

}  // namespace dtrain::comm::algo
