// Linear gather and scatter: the root posts one receive (or send) per rank at once and the
// transport moves them concurrently.
//
// Cost: (N-1) alpha + (N-1)/N M beta at the root, which has to move that data anyway: a tree
// would save latency terms only.
#include <cstring>
#include <vector>

#include "comm/algorithms/algorithm.h"
#include "comm/algorithms/algorithms.h"

namespace dtrain::comm::algo {

void gather_linear(CollectiveContext& ctx, std::byte* out, const std::byte* in, size_t block) {
  const int n = ctx.size(), root = ctx.call().root;
  if (ctx.rank() != root) {
    ctx.wait(ctx.send(root, in, block));
    return;
  }
  if (block > 0 && out + root * block != in) std::memmove(out + root * block, in, block);
  std::vector<CollectiveContext::RequestPtr> recvs;
  for (int i = 0; i < n; ++i)
    if (i != root) recvs.push_back(ctx.recv(i, out + i * block, block));
  ctx.wait(recvs);
}

void scatter_linear(CollectiveContext& ctx, std::byte* out, const std::byte* in, size_t block) {
  const int n = ctx.size(), root = ctx.call().root;
  if (ctx.rank() != root) {
    ctx.wait(ctx.recv(root, out, block));
    return;
  }
  std::vector<CollectiveContext::RequestPtr> sends;
  for (int i = 0; i < n; ++i)
    if (i != root) sends.push_back(ctx.send(i, in + i * block, block));
  if (block > 0 && out != in + root * block) std::memmove(out, in + root * block, block);
  ctx.wait(sends);
}

extern const Algorithm kGatherLinear{
    .name = "linear",
    .kind = CollectiveKind::kGather,
    .file = "gather_scatter_linear.cc",
    .formula = "(N-1) alpha + (N-1) M beta at the root",
    .chosen = "always",
    .cost = [](const CostInput& c) { return (c.N - 1) * (c.link.alpha + c.M * c.link.beta); },
    .run =
        [](const Invocation& i) {
          gather_linear(i.ctx, bytes_of(i.out), bytes_of(i.in), i.in.nbytes());
        },
};

extern const Algorithm kScatterLinear{
    .name = "linear",
    .kind = CollectiveKind::kScatter,
    .file = "gather_scatter_linear.cc",
    .formula = "(N-1) alpha + (N-1) M beta at the root",
    .chosen = "always",
    .cost = [](const CostInput& c) { return (c.N - 1) * (c.link.alpha + c.M * c.link.beta); },
    .run =
        [](const Invocation& i) {
          scatter_linear(i.ctx, bytes_of(i.out), bytes_of(i.in), i.out.nbytes());
        },
};

}  // namespace dtrain::comm::algo
