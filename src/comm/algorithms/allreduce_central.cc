// Central all-reduce, the parameter-server shape: every rank sends its buffer to rank 0, which
// reduces them in rank order and sends the result back to everyone.
//
// Cost: 2 (N-1) (alpha + M beta) + (N-1) M gamma, all through rank 0's link: the bottleneck that
// ring and halving-doubling remove. Kept for comparison and for groups of two or three ranks.
#include <vector>

#include "comm/algorithms/algorithm.h"
#include "comm/algorithms/algorithms.h"
#include "common/reduce.h"

namespace dtrain::comm::algo {

void allreduce_central(CollectiveContext& ctx, std::byte* data, size_t count) {
  const int n = ctx.size();
  if (n == 1) return;
  const size_t bytes = count * ctx.element_size();
  if (ctx.rank() != 0) {
    ctx.wait(ctx.send(0, data, bytes));
    ctx.wait(ctx.recv(0, data, bytes));
    return;
  }
  std::byte* scratch = ctx.scratch(bytes * (n - 1));
  std::vector<CollectiveContext::RequestPtr> recvs;
  for (int r = 1; r < n; ++r) recvs.push_back(ctx.recv(r, scratch + (r - 1) * bytes, bytes));
  for (int r = 1; r < n; ++r) {
    ctx.wait(recvs[r - 1]);
    reduce_into(data, scratch + (r - 1) * bytes, count, ctx.call().dtype, ctx.call().op);
  }
  std::vector<CollectiveContext::RequestPtr> sends;
  for (int r = 1; r < n; ++r) sends.push_back(ctx.send(r, data, bytes));
  ctx.wait(sends);
}

extern const Algorithm kAllreduceCentral{
    .name = "central",
    .kind = CollectiveKind::kAllreduce,
    .file = "allreduce_central.cc",
    .formula = "2(N-1)(alpha + M beta) + (N-1) M gamma",
    .chosen = "never by default: the parameter-server shape, for comparison and tiny groups",
    .cost =
        [](const CostInput& c) {
          return 2 * (c.N - 1) * (c.link.alpha + c.M * c.link.beta) + (c.N - 1) * c.M * c.gamma;
        },
    .run = [](const Invocation& i) { allreduce_central(i.ctx, bytes_of(i.out), i.out.numel); },
};

}  // namespace dtrain::comm::algo
