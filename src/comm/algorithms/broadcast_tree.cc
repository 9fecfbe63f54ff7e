// Binomial-tree broadcast: in round k the ranks that already have the data (relative to the
// root) send it to the rank 2^k further on, so ceil(log2 N) rounds reach everyone. Large
// buffers move in chunks so that a rank forwards the first chunk while the next arrives.
//
// Cost: ceil(log2 N) (alpha + M beta) without pipelining; with C chunks about
// (ceil(log2 N) + C - 1)(alpha + M/C beta). Best for small and mid-sized messages.
#include <algorithm>
#include <vector>

#include "comm/algorithms/algorithm.h"
#include "comm/algorithms/algorithms.h"

namespace dtrain::comm::algo {

void broadcast_tree(CollectiveContext& ctx, std::byte* data, size_t bytes) {
  const int n = ctx.size();
  if (n == 1) return;
  const int root = ctx.call().root;
  const int vr = (ctx.rank() - root + n) % n;
  auto real = [&](int v) { return (v + root) % n; };
  constexpr size_t kChunk = size_t{1} << 20;
  const size_t chunks = std::max<size_t>(1, (bytes + kChunk - 1) / kChunk);
  auto chunk = [&](size_t c) {
    size_t off = c * kChunk;
    return std::pair<size_t, size_t>{off, std::min(kChunk, bytes - std::min(bytes, off))};
  };

  int parent = -1;
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      parent = real(vr - mask);
      break;
    }
    mask <<= 1;
  }
  std::vector<int> children;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < n) children.push_back(real(vr + mask));

  std::vector<CollectiveContext::RequestPtr> recvs, sends;
  if (parent >= 0)
    for (size_t c = 0; c < chunks; ++c) {
      auto [off, len] = chunk(c);
      recvs.push_back(ctx.recv(parent, data + off, len));
    }
  for (size_t c = 0; c < chunks; ++c) {
    if (parent >= 0) ctx.wait(recvs[c]);
    auto [off, len] = chunk(c);
    for (int child : children) sends.push_back(ctx.send(child, data + off, len));
  }
  ctx.wait(sends);
}

extern const Algorithm kBroadcastTree{
    .name = "tree",
    .kind = CollectiveKind::kBroadcast,
    .file = "broadcast_tree.cc",
    .formula = "ceil(log2 N)(alpha + M beta), chunked",
    .chosen = "small and mid-sized buffers",
    .cost = [](const CostInput& c) { return c.log2n * (c.link.alpha + c.M * c.link.beta); },
    .run = [](const Invocation& i) { broadcast_tree(i.ctx, bytes_of(i.out), i.out.nbytes()); },
};

}  // namespace dtrain::comm::algo
