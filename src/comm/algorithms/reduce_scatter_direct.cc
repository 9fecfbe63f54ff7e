// Direct reduce-scatter, for ranks that share a host and may read each other's memory
// (cross-memory attach), as the direct all-reduce. Rank r owes the sum of every rank's block r:
// it reads that block straight out of each peer's input, a chunk at a time, and adds the
// copies up while the chunk is still in cache. No byte goes through a ring or a socket, and no
// rank copies its input first (the ring must, to reduce in place without touching the caller's
// buffer): each block crosses memory once on its way to the rank that owns it.
//
// Every rank writes only its own output (its block of its own input, in place), which no peer
// reads, so the ranks need no order among themselves while they work. The copies are added in rank
// order 0, 1, ..., n-1 on every rank, so the results are the same from run to run. Two rounds of
// empty messages frame it: the input addresses go out (and with them "my input is ready"); "I am
// done with your input" lets each rank return, and its caller reuse the input, once every peer has
// read from it.
//
// Cost: 4 alpha_l + (N-1)/N M (beta_l + gamma), M the input's bytes: a single copy's worth of
// bandwidth where the ring pays a copy in, two through each ring, and a copy out.
#include <algorithm>
#include <cstring>

#include "comm/algorithms/algorithm.h"
#include "comm/algorithms/algorithms.h"
#include "common/reduce.h"

namespace dtrain::comm::algo {
namespace {

// A chunk and its landing place fit one core's L2 cache (as allreduce_direct.cc's).
constexpr size_t kChunkBytes = size_t{256} << 10;

void reduce_scatter_direct(const Invocation& i) {
  CollectiveContext& ctx = i.ctx;
  const int n = ctx.size(), r = ctx.rank();
  const size_t block = i.out.nbytes();
  const auto* in = static_cast<const std::byte*>(i.in.data);
  std::byte* out = bytes_of(i.out);
  if (n == 1) {
    if (block > 0) std::memmove(out, in, block);
    return;
  }
  const uint64_t mine = reinterpret_cast<uint64_t>(in);
  std::vector<uint64_t> inputs(n);
  all_exchange(ctx, &mine, inputs.data());

  const size_t elem = ctx.element_size(), count = i.out.numel;
  const size_t chunk = std::max<size_t>(1, kChunkBytes / elem);
  const size_t chunk_bytes = std::min(count, chunk) * elem;
  // The sum builds up in `acc`, not in the output, which may be this rank's block of its own
  // input (an in-place call, as the hierarchical all-reduce makes): that block is read first.
  std::byte* acc = ctx.scratch(2 * chunk_bytes);
  std::byte* landing = acc + chunk_bytes;
  const size_t own = static_cast<size_t>(r) * block;  // block r's place in every input
  for (size_t lo = 0; lo < count; lo += chunk) {
    const size_t len = std::min(chunk, count - lo), at = lo * elem, bytes = len * elem;
    if (r == 0)
      std::memcpy(acc, in + own + at, bytes);
    else
      ctx.read_peer(0, acc, inputs[0] + own + at, bytes);
    for (int p = 1; p < n; ++p) {
      const std::byte* from = in + own + at;
      if (p != r) {
        ctx.read_peer(p, landing, inputs[p] + own + at, bytes);
        from = landing;
      }
      reduce_into(acc, from, len, ctx.call().dtype, ctx.call().op);
    }
    std::memcpy(out + at, acc, bytes);
  }
  all_exchange(ctx, static_cast<const uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr));
}

}  // namespace

extern const Algorithm kReduceScatterDirect{
    .name = "direct",
    .kind = CollectiveKind::kReduceScatter,
    .file = "reduce_scatter_direct.cc",
    .formula = "4 alpha_l + (N-1)/N M (beta_l + gamma)",
    .chosen =
        "one host, shared memory with cross-memory attach, beyond a few hundred KiB: each rank "
        "reads its block straight from the peers' inputs and adds it up",
    .needs = Needs::kReadAll,
    .reduces_in_cache = true,
    .cost =
        [](const CostInput& c) {
          return 4 * c.link.alpha + (c.N - 1) / c.N * c.M * (c.link.beta + c.gamma);
        },
    .run = reduce_scatter_direct,
};

}  // namespace dtrain::comm::algo
