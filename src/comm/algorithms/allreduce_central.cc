// Central all-reduce, the parameter-server shape: every rank sends its buffer to rank 0, which
// reduces them in rank order and sends the result back to everyone.
//
// Cost: 2 (N-1) (alpha + M beta) + (N-1) M gamma, all through rank 0's link: the bottleneck that
// ring and halving-doubling remove. Kept for comparison and for groups of two or three ranks.
#include <vector>

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

}  // namespace dtrain::comm::algo
