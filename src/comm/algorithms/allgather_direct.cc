// Direct all-gather, for ranks that share a host and may read each other's memory (cross-memory
// attach), as the direct all-reduce: each rank reads every peer's block straight out of the
// peer's input into its place in the output. A block crosses memory once, where the ring copies
// it into a ring and out again at every rank it passes.
//
// Every rank writes only its own output and reads the peers' inputs, which they leave alone
// until the call ends. Two rounds of empty messages frame it: the input addresses go out (and
// with them "my block is ready"); "I am done with your input" lets each rank return once every
// peer has read its block.
//
// Cost: 4 alpha_l + (N-1) M beta_l, M one rank's block.
#include <vector>

#include "comm/algorithms/algorithm.h"
#include "comm/algorithms/algorithms.h"

namespace dtrain::comm::algo {
namespace {

void allgather_direct(const Invocation& i) {
  place_own_block(i);
  CollectiveContext& ctx = i.ctx;
  const int n = ctx.size(), r = ctx.rank();
  if (n == 1) return;
  const uint64_t mine = reinterpret_cast<uint64_t>(i.in.data);
  std::vector<uint64_t> inputs(n);
  all_exchange(ctx, &mine, inputs.data());
  for (int k = 1; k < n; ++k) {
    const int p = (r + k) % n;  // a different first peer on every rank
    if (i.out_sizes[p] > 0)
      ctx.read_peer(p, bytes_of(i.out) + i.out_offsets[p], inputs[p], i.out_sizes[p]);
  }
  all_exchange(ctx, static_cast<const uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr));
}

}  // namespace

extern const Algorithm kAllgatherDirect{
    .name = "direct",
    .kind = CollectiveKind::kAllgather,
    .file = "allgather_direct.cc",
    .formula = "4 alpha_l + (N-1) M beta_l, M one rank's block",
    .chosen =
        "one host, shared memory with cross-memory attach, blocks beyond the cache: each rank "
        "reads the peers' blocks straight from their inputs",
    .needs = Needs::kReadAll,
    .cost = [](const CostInput& c) { return 4 * c.link.alpha + (c.N - 1) * c.M * c.link.beta; },
    .run = allgather_direct,
};

}  // namespace dtrain::comm::algo
