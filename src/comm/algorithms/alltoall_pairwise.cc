// Pairwise-exchange all-to-all: in step s (1..N-1) rank r sends its block for rank r+s and
// receives the block from rank r-s, so every step is a permutation and no rank is flooded.
//
// Cost: (N-1) alpha + (N-1)/N M beta, M the bytes a rank sends in all.
#include <cstring>

#include "comm/algorithms/algorithm.h"
#include "comm/algorithms/algorithms.h"

namespace dtrain::comm::algo {

void alltoall_pairwise(CollectiveContext& ctx, std::byte* out, std::span<const size_t> out_offsets,
                       std::span<const size_t> out_sizes, const std::byte* in,
                       std::span<const size_t> in_offsets, std::span<const size_t> in_sizes) {
  const int n = ctx.size(), r = ctx.rank();
  if (out_sizes[r] > 0) std::memmove(out + out_offsets[r], in + in_offsets[r], out_sizes[r]);
  for (int s = 1; s < n; ++s) {
    const int to = (r + s) % n, from = (r - s + n) % n;
    ctx.send_recv(to, in + in_offsets[to], in_sizes[to], from, out + out_offsets[from],
                  out_sizes[from]);
  }
}

namespace {
void run_pairwise(const Invocation& i) {
  alltoall_pairwise(i.ctx, bytes_of(i.out), i.out_offsets, i.out_sizes, bytes_of(i.in),
                    i.in_offsets, i.in_sizes);
}
}  // namespace

extern const Algorithm kAlltoallPairwise{
    .name = "pairwise",
    .kind = CollectiveKind::kAlltoall,
    .file = "alltoall_pairwise.cc",
    .formula = "(N-1)(alpha + M beta), M one block",
    .chosen = "always",
    .cost = [](const CostInput& c) { return (c.N - 1) * (c.link.alpha + c.M * c.link.beta); },
    .run = run_pairwise,
};

extern const Algorithm kAlltoallvPairwise{
    .name = "pairwise",
    .kind = CollectiveKind::kAlltoallv,
    .file = "alltoall_pairwise.cc",
    .formula = "(N-1)(alpha + M beta), M one block",
    .chosen = "always",
    .cost = [](const CostInput& c) { return (c.N - 1) * (c.link.alpha + c.M * c.link.beta); },
    .run = run_pairwise,
};

}  // namespace dtrain::comm::algo
