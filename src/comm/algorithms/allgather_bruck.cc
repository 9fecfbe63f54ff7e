// Bruck all-gather: recursive doubling for any number of ranks. Each rank keeps a buffer that
// starts with its own block; in step k it sends the first min(2^k, N - 2^k) blocks to rank
// r - 2^k and appends as many from rank r + 2^k, so it holds blocks r, r+1, ..., r+2^(k+1)-1.
// A final rotation puts the blocks in rank order.
//
// Cost: ceil(log2 N) alpha + (N-1)/N M beta (+ one local copy of M). Fewer messages than the
// ring: the choice for small blocks.
#include <cstring>

#include "comm/algorithms/algorithm.h"
#include "comm/algorithms/algorithms.h"

namespace dtrain::comm::algo {

void allgather_bruck(CollectiveContext& ctx, std::byte* out, size_t block) {
  const int n = ctx.size(), r = ctx.rank();
  // Empty blocks: nothing to move, and `out` may be null (memcpy's arguments must not be, even
  // for 0 bytes: UBSan stops the rank).
  if (n == 1 || block == 0) return;
  std::byte* tmp = ctx.scratch(block * n);
  std::memcpy(tmp, out + r * block, block);
  for (int have = 1; have < n; have *= 2) {
    const int count = std::min(have, n - have);
    const int to = (r - have + n) % n, from = (r + have) % n;
    ctx.send_recv(to, tmp, count * block, from, tmp + have * block, count * block);
  }
  // tmp[i] holds the block of rank (r + i) mod n.
  for (int i = 0; i < n; ++i) std::memcpy(out + ((r + i) % n) * block, tmp + i * block, block);
}

extern const Algorithm kAllgatherBruck{
    .name = "bruck",
    .kind = CollectiveKind::kAllgather,
    .file = "allgather_bruck.cc",
    .formula = "ceil(log2 N) alpha + (N-1) t M beta + a local rotation, t copies a trip",
    .chosen = "small blocks (recursive doubling for any N)",
    // The rotation copies the gathered buffer once more: modelled as a memory copy at 15 GB/s.
    .cost =
        [](const CostInput& c) {
          return c.log2n * c.link.alpha + (c.N - 1) * (c.trip + c.reread) * c.M * c.link.beta +
                 c.N * c.M / 15e9;
        },
    .run =
        [](const Invocation& i) {
          place_own_block(i);
          allgather_bruck(i.ctx, bytes_of(i.out), i.in.nbytes());
        },
};

}  // namespace dtrain::comm::algo
