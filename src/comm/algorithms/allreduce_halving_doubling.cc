// Recursive halving-doubling all-reduce (Rabenseifner): a reduce-scatter by recursive halving
// followed by an all-gather by recursive doubling.
//
// At each of log2(p) halving steps a rank swaps half of its current range with the partner whose
// rank differs in one bit, keeping and reducing the other half; ranges halve until each rank
// owns 1/p of the buffer, fully reduced. The doubling steps retrace the same partners in
// reverse, exchanging whole owned ranges until everyone has everything. Non-powers of two fold
// first (fold.h).
//
// Cost: 2 log2(p) alpha + 2 (p-1)/p M beta + (p-1)/p M gamma (+ the fold). As bandwidth-lean as
// the ring with log2(p) instead of N-1 latency terms: the choice for mid-sized messages.
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/fold.h"
#include "common/reduce.h"

namespace dtrain::comm::algo {

void allreduce_halving_doubling(CollectiveContext& ctx, std::byte* data, size_t count) {
  const int n = ctx.size();
  if (n == 1) return;
  const size_t elem = ctx.element_size();
  const auto dtype = ctx.call().dtype;
  const auto op = ctx.call().op;
  const Fold fold(n, ctx.rank());
  std::byte* scratch = ctx.scratch(count * elem);

  if (fold.partner >= 0) {
    if (fold.new_rank < 0) {
      ctx.wait(ctx.send(fold.partner, data, count * elem));
    } else {
      ctx.wait(ctx.recv(fold.partner, scratch, count * elem));
      reduce_into(data, scratch, count, dtype, op);
    }
  }
  if (fold.new_rank >= 0) {
    const int v = fold.new_rank;
    struct Range {
      size_t lo, hi;  // elements
    };
    std::vector<Range> kept;  // range owned after each halving step, for the doubling steps
    Range cur{0, count};
    for (int d = fold.p / 2; d >= 1; d /= 2) {
      const int partner = fold.old_rank(v ^ d);
      const size_t mid = cur.lo + (cur.hi - cur.lo) / 2;
      const bool low = (v & d) == 0;
      const Range keep = low ? Range{cur.lo, mid} : Range{mid, cur.hi};
      const Range give = low ? Range{mid, cur.hi} : Range{cur.lo, mid};
      ctx.send_recv(partner, data + give.lo * elem, (give.hi - give.lo) * elem, partner,
                    scratch + keep.lo * elem, (keep.hi - keep.lo) * elem);
      reduce_into(data + keep.lo * elem, scratch + keep.lo * elem, keep.hi - keep.lo, dtype, op);
      kept.push_back(cur);
      cur = keep;
    }
    for (int d = 1; d < fold.p; d *= 2) {
      const int partner = fold.old_rank(v ^ d);
      const Range whole = kept.back();
      kept.pop_back();
      // The partner owns the other half of `whole`.
      const Range theirs = cur.lo == whole.lo ? Range{cur.hi, whole.hi} : Range{whole.lo, cur.lo};
      ctx.send_recv(partner, data + cur.lo * elem, (cur.hi - cur.lo) * elem, partner,
                    data + theirs.lo * elem, (theirs.hi - theirs.lo) * elem);
      cur = whole;
    }
  }
  if (fold.partner >= 0) {
    if (fold.new_rank < 0) {
      ctx.wait(ctx.recv(fold.partner, data, count * elem));
    } else {
      ctx.wait(ctx.send(fold.partner, data, count * elem));
    }
  }
}

}  // namespace dtrain::comm::algo
