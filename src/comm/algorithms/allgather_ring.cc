// Ring all-gather: in step s every rank sends the block it received in step s-1 (its own at
// s = 0) to its right neighbour and receives the next from its left; after N-1 steps every rank
// has every block. Blocks may differ in size (all-gather-v).
//
// Cost: (N-1) alpha + (N-1)/N M beta, M the gathered size. Bandwidth-optimal.
#include <vector>

#include "comm/algorithms/algorithm.h"
#include "comm/algorithms/algorithms.h"

namespace dtrain::comm::algo {

void allgather_ring(CollectiveContext& ctx, std::byte* out, std::span<const size_t> offsets,
                    std::span<const size_t> sizes) {
  const int n = ctx.size(), r = ctx.rank();
  if (n == 1) return;
  const int right = (r + 1) % n, left = (r - 1 + n) % n;
  for (int s = 0; s < n - 1; ++s) {
    const int send_block = (r - s + n) % n;
    const int recv_block = (r - s - 1 + n) % n;
    ctx.send_recv(right, out + offsets[send_block], sizes[send_block], left,
                  out + offsets[recv_block], sizes[recv_block]);
  }
}

namespace {
// Blocks of equal size or not (all-gather-v): this rank's first, then the ring.
void run_ring(const Invocation& i) {
  place_own_block(i);
  allgather_ring(i.ctx, bytes_of(i.out), i.out_offsets, i.out_sizes);
}
}  // namespace

// On shared memory a block's trip is two copies (CostInput::trip), and beyond the cache each
// goes through memory (CostInput::reread), as the ring all-reduce's.
extern const Algorithm kAllgatherRing{
    .name = "ring",
    .kind = CollectiveKind::kAllgather,
    .file = "allgather_ring.cc",
    .formula = "(N-1)(alpha + t M beta), M one rank's block, t copies a trip",
    .chosen = "large blocks where the direct form cannot run (across hosts)",
    .flows = Flows::kOnePerHost,
    .cost =
        [](const CostInput& c) {
          return (c.N - 1) * (c.link.alpha + (c.trip + c.reread) * c.M * c.link.beta);
        },
    .run = run_ring,
};

extern const Algorithm kAllgathervRing{
    .name = "ring",
    .kind = CollectiveKind::kAllgatherv,
    .file = "allgather_ring.cc",
    .formula = "(N-1)(alpha + M beta), M one rank's block",
    .chosen = "always",
    .flows = Flows::kOnePerHost,
    .cost = [](const CostInput& c) { return (c.N - 1) * (c.link.alpha + c.M * c.link.beta); },
    .run = run_ring,
};

}  // namespace dtrain::comm::algo
