// Scatter + all-gather broadcast (van de Geijn): the root sends segment i of the buffer to rank
// i, then a ring all-gather gives everyone every segment.
//
// Cost: (N-1) alpha + (N-1)/N M beta for the scatter plus (N-1) alpha + (N-1)/N M beta for the
// all-gather: each link carries about 2M/N... twice the data a tree's root would send once, but
// spread over all links, so it wins for large buffers on larger groups.
#include <vector>

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

}  // namespace dtrain::comm::algo
