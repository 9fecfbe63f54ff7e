// Recursive doubling all-reduce: log2(p) steps, each exchanging the whole buffer with the
// partner whose rank differs in one bit and reducing it. Non-powers of two fold first (fold.h).
// Every rank reduces the same pairs in the same tree, so all end bit-identical.
//
// Cost: log2(p) (alpha + M beta + M gamma) (+ the fold). Fewest messages of all: the choice for
// tiny buffers, where alpha dominates.
#include "comm/algorithms/algorithm.h"
#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/fold.h"
#include "common/reduce.h"

namespace dtrain::comm::algo {

void allreduce_recursive_doubling(CollectiveContext& ctx, std::byte* data, size_t count) {
  const int n = ctx.size();
  if (n == 1) return;
  const size_t bytes = count * ctx.element_size();
  const auto dtype = ctx.call().dtype;
  const auto op = ctx.call().op;
  const Fold fold(n, ctx.rank());
  std::byte* scratch = ctx.scratch(bytes);

  if (fold.partner >= 0 && fold.new_rank < 0) {
    ctx.wait(ctx.send(fold.partner, data, bytes));
    ctx.wait(ctx.recv(fold.partner, data, bytes));
    return;
  }
  if (fold.partner >= 0) {
    ctx.wait(ctx.recv(fold.partner, scratch, bytes));
    reduce_into(data, scratch, count, dtype, op);
  }
  for (int d = 1; d < fold.p; d *= 2) {
    const int partner = fold.old_rank(fold.new_rank ^ d);
    ctx.send_recv(partner, data, bytes, partner, scratch, bytes);
    reduce_into(data, scratch, count, dtype, op);
  }
  if (fold.partner >= 0) ctx.wait(ctx.send(fold.partner, data, bytes));
}

extern const Algorithm kAllreduceRecursiveDoubling{
    .name = "recursive_doubling",
    .kind = CollectiveKind::kAllreduce,
    .file = "allreduce_recursive_doubling.cc",
    .formula = "log2 p (alpha + M beta + M gamma) (+ fold)",
    .chosen = "tiny buffers (fewest messages)",
    .cost =
        [](const CostInput& c) {
          return c.lp * (c.link.alpha + (1 + c.reread) * c.M * c.link.beta + c.M * c.gamma) +
                 c.fold;
        },
    .run =
        [](const Invocation& i) {
          allreduce_recursive_doubling(i.ctx, bytes_of(i.out), i.out.numel);
        },
};

}  // namespace dtrain::comm::algo
