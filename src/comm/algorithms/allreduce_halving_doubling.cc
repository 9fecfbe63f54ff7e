// Recursive halving-doubling all-reduce (Rabenseifner): a reduce-scatter by recursive halving
// followed by an all-gather by recursive doubling.
//
// At each of log2(p) halving steps a rank swaps half of its current range with the partner whose
// rank differs in one bit, keeping and reducing the other half; ranges halve until each rank
// owns 1/p of the buffer, fully reduced. The doubling steps retrace the same partners in
// reverse, exchanging whole owned ranges until everyone has everything. Non-powers of two fold
// first (fold.h).
//
// Over TCP, the pair adds each halving message into the kept range as it arrives
// (Pair::irecv_reduce: through a small buffer that stays in cache, instead of a scratch buffer
// of M/2 + M/4 + ... written out to memory and read back). A step's receives are therefore
// posted only when it starts: the range it reduces into is final only once the step before has
// been reduced, and the partner's early bytes wait in the socket meanwhile. Shared memory posts
// every receive of the call before the first send, into separate parts of the scratch, so that
// no message arrives before its buffer is known (an early message would cost a copy). Either
// way, a partner's halving receives are posted before its doubling ones (messages of one tag
// match in order). The doubling step with partner d receives into the range this rank gave
// away at halving step d, which is still being sent then; that is safe because the partner
// sends into it only after it has received all of that range. Over TCP, messages move in
// chunks, each reduced while the next is on the wire.
//
// Cost: 2 log2(p) alpha + 2 (p-1)/p M beta + (p-1)/p M gamma (+ the fold). As bandwidth-lean as
// the ring with log2(p) instead of N-1 latency terms: the choice for mid-sized messages.
#include <algorithm>
#include <vector>

#include "comm/algorithms/algorithm.h"
#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/fold.h"
#include "common/reduce.h"

namespace dtrain::comm::algo {
namespace {

// Over TCP, halves move in messages of this size: the first ones are being reduced while the
// rest is on the wire (smaller chunks measured slower, larger no faster). Shared memory moves
// each half in one message: its ring already pipelines the copies, and chunking measured slower
// there (docs/algorithms.md).
constexpr size_t kTcpChunkBytes = size_t{256} << 10;

struct Range {
  size_t lo, hi;  // elements
};

// One halving step (and the doubling step that retraces it).
struct Step {
  int partner;
  size_t per;         // elements per message
  bool reducing;      // TCP: halving messages reduce into `keep` as they arrive
  Range keep;         // reduced here, then sent back whole in the doubling step
  Range give;         // sent to the partner; its reduced version comes back into it
  size_t scratch_at;  // where in the scratch the partner's half of `keep` lands (elements)
  std::vector<CollectiveContext::RequestPtr> halving_recvs, doubling_recvs;
};

}  // namespace

void allreduce_halving_doubling(CollectiveContext& ctx, std::byte* data, size_t count) {
  const int n = ctx.size();
  if (n == 1) return;
  const size_t elem = ctx.element_size();
  const auto dtype = ctx.call().dtype;
  const auto op = ctx.call().op;
  const Fold fold(n, ctx.rank());
  std::byte* scratch = ctx.scratch(count * elem);
  using Requests = std::vector<CollectiveContext::RequestPtr>;

  if (fold.partner >= 0) {
    if (fold.new_rank < 0) {
      ctx.wait(ctx.send(fold.partner, data, count * elem));
    } else if (!ctx.on_shared_memory(fold.partner)) {
      ctx.wait(ctx.recv_reduce(fold.partner, data, count * elem));
    } else {
      ctx.wait(ctx.recv(fold.partner, scratch, count * elem));
      reduce_into(data, scratch, count, dtype, op);
    }
  }
  if (fold.new_rank >= 0) {
    const int v = fold.new_rank;
    // Calls `one(lo, n)` for each chunk of `r`.
    auto chunks = [](const Range& r, size_t per, auto&& one) {
      for (size_t lo = r.lo; lo < r.hi; lo += per) one(lo, std::min(per, r.hi - lo));
    };
    // A step's receives from its partner, halving ones first (messages of one tag match in
    // order): over TCP they reduce into `data` as they arrive.
    auto post_receives = [&](Step& s) {
      chunks(s.keep, s.per, [&](size_t lo, size_t k) {
        s.halving_recvs.push_back(
            s.reducing
                ? ctx.recv_reduce(s.partner, data + lo * elem, k * elem)
                : ctx.recv(s.partner, scratch + (s.scratch_at + lo - s.keep.lo) * elem, k * elem));
      });
      chunks(s.give, s.per, [&](size_t lo, size_t k) {
        s.doubling_recvs.push_back(ctx.recv(s.partner, data + lo * elem, k * elem));
      });
    };
    std::vector<Step> steps;
    Range cur{0, count};
    size_t scratch_at = 0;
    for (int d = fold.p / 2; d >= 1; d /= 2) {
      const size_t mid = cur.lo + (cur.hi - cur.lo) / 2;
      const bool low = (v & d) == 0;
      const int partner = fold.old_rank(v ^ d);
      const bool tcp = !ctx.on_shared_memory(partner);
      const size_t per =
          tcp ? std::max<size_t>(1, kTcpChunkBytes / elem) : std::max<size_t>(1, cur.hi - cur.lo);
      Step s{partner,
             per,
             tcp,
             low ? Range{cur.lo, mid} : Range{mid, cur.hi},
             low ? Range{mid, cur.hi} : Range{cur.lo, mid},
             scratch_at,
             {},
             {}};
      if (!s.reducing) post_receives(s);
      scratch_at += s.keep.hi - s.keep.lo;
      cur = s.keep;
      steps.push_back(std::move(s));
    }
    Requests sends;
    for (Step& s : steps) {
      // The reduced range of the step before is final now: this step may reduce into part of it.
      if (s.reducing) post_receives(s);
      const size_t first_send = sends.size();
      chunks(s.give, s.per, [&](size_t lo, size_t k) {
        sends.push_back(ctx.send(s.partner, data + lo * elem, k * elem));
      });
      // A whole half in one message (shared memory) moves only while this rank polls: finish
      // sending it before reducing, or the partner waits out the reduction for its last bytes.
      if (s.halving_recvs.size() == 1) ctx.wait(std::span(sends).subspan(first_send));
      // The last step's range is this rank's: each chunk of it is final once reduced, and an
      // average's is divided then, while in cache, before the doubling steps hand it on.
      const size_t divide_by =
          &s == &steps.back() && op == ReduceOp::kAvg ? static_cast<size_t>(n) : 1;
      if (s.reducing && divide_by == 1) {
        ctx.wait(s.halving_recvs);
      } else {
        size_t i = 0;
        chunks(s.keep, s.per, [&](size_t lo, size_t k) {
          ctx.wait(s.halving_recvs[i++]);
          if (!s.reducing)
            reduce_into(data + lo * elem, scratch + (s.scratch_at + lo - s.keep.lo) * elem, k,
                        dtype, op);
          if (divide_by > 1) scale_down(data + lo * elem, k, dtype, divide_by);
        });
      }
    }
    for (auto s = steps.rbegin(); s != steps.rend(); ++s) {
      chunks(s->keep, s->per, [&](size_t lo, size_t k) {
        sends.push_back(ctx.send(s->partner, data + lo * elem, k * elem));
      });
      ctx.wait(s->doubling_recvs);
    }
    ctx.wait(sends);
  }
  if (fold.partner >= 0) {
    if (fold.new_rank < 0) {
      ctx.wait(ctx.recv(fold.partner, data, count * elem));
    } else {
      ctx.wait(ctx.send(fold.partner, data, count * elem));
    }
  }
}

extern const Algorithm kAllreduceHalvingDoubling{
    .name = "halving_doubling",
    .kind = CollectiveKind::kAllreduce,
    .file = "allreduce_halving_doubling.cc",
    .formula = "2 log2 p alpha + 2(p-1)/p M beta + (p-1)/p M gamma (+ fold)",
    .chosen = "mid-sized buffers on larger groups",
    .averages = true,
    .cost =
        [](const CostInput& c) {
          return 2 * c.lp * c.link.alpha +
                 (1 + c.reread) * 2 * (c.p - 1) / c.p * c.M * c.link.beta +
                 (c.p - 1) / c.p * c.M * c.gamma + c.fold;
        },
    .run =
        [](const Invocation& i) {
          allreduce_halving_doubling(i.ctx, bytes_of(i.out), i.out.numel);
        },
};

}  // namespace dtrain::comm::algo
