// Binomial-tree reduce: the broadcast tree run backwards. In round k every rank whose relative
// rank has bit k set sends its partial result to the rank 2^k below and drops out; the others
// receive and reduce. After ceil(log2 N) rounds the root holds the reduction.
//
// Cost: ceil(log2 N) (alpha + M beta + M gamma). Best for small buffers; large ones use the
// ring (reduce_ring.cc).
#include "comm/algorithms/algorithm.h"
#include "comm/algorithms/algorithms.h"
#include "common/reduce.h"

namespace dtrain::comm::algo {

void reduce_tree(CollectiveContext& ctx, std::byte* data, size_t count) {
  const int n = ctx.size();
  if (n == 1) return;
  const int root = ctx.call().root;
  const int vr = (ctx.rank() - root + n) % n;
  const size_t bytes = count * ctx.element_size();
  std::byte* scratch = nullptr;
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      ctx.wait(ctx.send((vr - mask + root) % n, data, bytes));
      return;
    }
    if (vr + mask < n) {
      if (scratch == nullptr) scratch = ctx.scratch(bytes);
      ctx.wait(ctx.recv((vr + mask + root) % n, scratch, bytes));
      reduce_into(data, scratch, count, ctx.call().dtype, ctx.call().op);
    }
  }
}

extern const Algorithm kReduceTree{
    .name = "tree",
    .kind = CollectiveKind::kReduce,
    .file = "reduce_tree.cc",
    .formula = "ceil(log2 N)(alpha + M beta + M gamma)",
    .chosen = "small buffers",
    .cost =
        [](const CostInput& c) {
          return c.log2n * (c.link.alpha + c.M * c.link.beta + c.M * c.gamma);
        },
    .run = [](const Invocation& i) { reduce_tree(i.ctx, bytes_of(i.out), i.out.numel); },
};

}  // namespace dtrain::comm::algo
