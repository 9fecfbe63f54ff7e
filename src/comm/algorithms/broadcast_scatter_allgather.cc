// Scatter + all-gather broadcast (van de Geijn): the root sends segment i of the buffer to rank
// i, then a ring all-gather gives everyone every segment.
//
// Cost: (N-1) alpha + (N-1)/N M beta for the scatter plus (N-1) alpha + (N-1)/N M beta for the
// all-gather: each link carries about 2M/N... twice the data a tree's root would send once, but
// spread over all links, so it wins for large buffers on larger groups.
#include <vector>

#include "comm/algorithms/algorithm.h"
#include "comm/algorithms/algorithms.h"

namespace dtrain::comm::algo {

void broadcast_scatter_allgather(CollectiveContext& ctx, std::byte* data, size_t count) {
  const int n = ctx.size();
  if (n == 1) return;
  const int root = ctx.call().root;
  const size_t elem = ctx.element_size();
  std::vector<size_t> offsets(n), sizes(n);
  for (int i = 0; i < n; ++i) {
    Segment s = segment(count, n, i);
    offsets[i] = s.offset * elem;
    sizes[i] = s.count * elem;
  }
  if (ctx.rank() == root) {
    std::vector<CollectiveContext::RequestPtr> sends;
    for (int i = 0; i < n; ++i)
      if (i != root) sends.push_back(ctx.send(i, data + offsets[i], sizes[i]));
    ctx.wait(sends);
  } else {
    ctx.wait(ctx.recv(root, data + offsets[ctx.rank()], sizes[ctx.rank()]));
  }
  allgather_ring(ctx, data, offsets, sizes);
}

extern const Algorithm kBroadcastScatterAllgather{
    .name = "scatter_allgather",
    .kind = CollectiveKind::kBroadcast,
    .file = "broadcast_scatter_allgather.cc",
    .formula = "2(N-1) alpha + 2(N-1)/N M beta",
    .chosen = "large buffers on larger groups",
    .cost =
        [](const CostInput& c) {
          return 2 * (c.N - 1) * c.link.alpha + 2 * (c.N - 1) / c.N * c.M * c.link.beta;
        },
    .run =
        [](const Invocation& i) {
          broadcast_scatter_allgather(i.ctx, bytes_of(i.out), i.out.numel);
        },
};

}  // namespace dtrain::comm::algo
