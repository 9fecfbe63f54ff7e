// Direct all-reduce, for ranks that share a host and may read and write each other's memory
// (cross-memory attach). The buffer is cut into chunks. Whoever takes a chunk reads it straight
// out of every peer's buffer, reduces it into its own, and writes the result straight into
// every peer's buffer while it is still in cache. No data goes through a socket or a ring; each
// byte crosses memory once on its way in and once on its way out.
//
// Who takes which chunk: the ranks draw tickets from a counter on a page they all map (a memfd
// of the group's first rank; see shm/shared_page.h), so a rank that has a core to itself takes
// more chunks than ranks that share one. Static slices leave the whole call waiting for the
// slowest core: with four ranks on two cores the scheduler sometimes keeps three on one
// (docs/algorithms.md has the measurements). The counter only grows: a call's tickets start
// where the previous call's ended, which every rank knows (each call draws its chunks plus one
// failed ticket per rank). Where the page cannot be shared (or DTRAIN_DIRECT_CLAIMS=0), each
// rank takes the chunks of its own 1/N slice.
//
// Only the rank that took a chunk touches it in any buffer (it reads the chunk everywhere before
// it overwrites it anywhere), so the ranks need no ordering among themselves while they work.
// It adds the ranks' copies up in rank order, whoever it is: results are bit-identical from run
// to run however the chunks were shared out (checkpoint-resume tests compare them bit for bit).
// Two rounds of empty messages frame it: the buffer addresses are exchanged (and with them "my
// input is in place"); "I am done with your buffer" lets each rank return once every peer has
// written its chunks. The first call of a group has one more round, to agree on the page.
//
// Cost: 4 alpha_shm (two rounds, each a message there and back through the rings) + 2 (N-1)/N M
// beta_copy + (N-1)/N M gamma, where beta_copy is one memory copy rather than a trip through the
// kernel's socket buffers (docs/algorithms.md).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "comm/algorithms/algorithm.h"
#include "comm/algorithms/algorithms.h"
#include "common/env.h"
#include "common/log.h"
#include "common/reduce.h"

namespace dtrain::comm::algo {
namespace {

// A chunk, the accumulator and a peer's copy fit one core's L2 cache (docs/algorithms.md has
// the measurements behind both bounds).
constexpr size_t kMaxChunkBytes = size_t{256} << 10;
// Enough chunks for the fast ranks to take up the slack of the slow, each still worth its two
// system calls per peer.
constexpr size_t kMinChunkBytes = size_t{128} << 10;
constexpr size_t kChunksPerRank = 2;

struct Hello {
  uint64_t address;  // the buffer
  int32_t pid;
  int32_t page_fd;  // rank 0 only: its descriptor of the shared page (-1: none)
};

// The first call of the group: rank 0 offers its page, the others adopt it, and all agree
// whether everyone has it (one more round).
void set_up_claims(CollectiveContext& ctx, const std::vector<Hello>& hello) {
  auto& st = ctx.persistent();
  std::string why;
  if (ctx.rank() != 0 && hello[0].page_fd >= 0)
    st.claims_page = transport::shm::SharedPage::adopt(hello[0].pid, hello[0].page_fd, &why);
  const uint64_t ok = st.claims_page.has_value() ? 1 : 0;
  std::vector<uint64_t> oks(ctx.size());
  all_exchange(ctx, &ok, oks.data());
  oks[ctx.rank()] = ok;
  st.claims_state = std::all_of(oks.begin(), oks.end(), [](uint64_t v) { return v == 1; }) ? 1 : -1;
  if (st.claims_state < 0) {
    DTRAIN_LOG_DEBUG("{}: direct all-reduce splits the work statically: {}", ctx.where(),
                     why.empty() ? "another rank could not share the counter page" : why);
    st.claims_page.reset();
  }
}

}  // namespace

void allreduce_direct(CollectiveContext& ctx, std::byte* data, size_t count) {
  const int n = ctx.size(), r = ctx.rank();
  if (n == 1) return;
  const size_t elem = ctx.element_size();
  auto& st = ctx.persistent();
  if (st.claims_state == 0 && r == 0 && !st.claims_page && env::get_bool(env::kDirectClaims)) {
    std::string why;
    st.claims_page = transport::shm::SharedPage::create(&why);
    if (!st.claims_page) DTRAIN_LOG_DEBUG("{}: no shared counter page: {}", ctx.where(), why);
  }
  const Hello mine{reinterpret_cast<uint64_t>(data), static_cast<int32_t>(::getpid()),
                   r == 0 && st.claims_page ? st.claims_page->fd() : -1};
  std::vector<Hello> hello(n);
  all_exchange(ctx, &mine, hello.data());
  if (st.claims_state == 0) set_up_claims(ctx, hello);

  const size_t chunk = std::max<size_t>(
      1, std::clamp(count * elem / (kChunksPerRank * n), kMinChunkBytes, kMaxChunkBytes) / elem);
  // An accumulator and a landing place for one peer's copy of a chunk.
  std::byte* acc = ctx.scratch(2 * std::min(count, chunk) * elem);
  std::byte* landing = acc + std::min(count, chunk) * elem;
  // Reduces elements [lo, lo + len) of every rank's buffer, always in rank order 0, 1, ..., n-1
  // whoever takes the chunk (floating-point sums depend on the order: results are the same from
  // run to run, however the chunks were shared out), and writes the result back everywhere.
  // Ranks 0 and 1 sum in their own buffer (rank 1 takes rank 0's copy as the first operand, as
  // everyone does); a later rank sums in the accumulator, since its own copy comes later in the
  // order, and copies the sum home at the end.
  const DType dtype = ctx.call().dtype;
  const ReduceOp op = ctx.call().op;
  auto take = [&](size_t lo, size_t len) {
    const size_t at = lo * elem, bytes = len * elem;
    std::byte* own = data + at;
    std::byte* sum = r <= 1 ? own : acc;
    if (r == 1) {
      ctx.read_peer(0, landing, hello[0].address + at, bytes);
      reduce_to(own, landing, own, len, dtype, op);
    } else if (r > 1) {
      ctx.read_peer(0, acc, hello[0].address + at, bytes);
    }
    for (int p = 1; p < n; ++p) {
      if (p == r) {
        if (sum != own) reduce_into(sum, own, len, dtype, op);
        continue;
      }
      ctx.read_peer(p, landing, hello[p].address + at, bytes);
      reduce_into(sum, landing, len, dtype, op);
    }
    if (op == ReduceOp::kAvg) scale_down(sum, len, dtype, static_cast<size_t>(n));  // in cache
    if (sum != own) std::memcpy(own, sum, bytes);
    for (int i = 1; i < n; ++i) {
      const int p = (r + i) % n;  // a different first peer on every rank
      ctx.write_peer(p, hello[p].address + at, own, bytes);
    }
  };

  if (st.claims_state > 0) {
    const uint64_t chunks = (count + chunk - 1) / chunk;
    const uint64_t base = st.claims_base;
    auto& counter = st.claims_page->word(0);
    for (uint64_t t; (t = counter.fetch_add(1, std::memory_order_relaxed)) < base + chunks;) {
      const size_t lo = static_cast<size_t>(t - base) * chunk;
      take(lo, std::min(chunk, count - lo));
    }
    st.claims_base = base + chunks + static_cast<uint64_t>(n);
  } else {
    const Segment own = segment(count, n, r);
    for (size_t off = 0; off < own.count; off += chunk)
      take(own.offset + off, std::min(chunk, own.count - off));
  }
  all_exchange(ctx, static_cast<const uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr));
}

extern const Algorithm kAllreduceDirect{
    .name = "direct",
    .kind = CollectiveKind::kAllreduce,
    .file = "allreduce_direct.cc",
    .formula = "4 alpha_l + (N-1)/N M (2 beta_l + gamma)",
    .chosen =
        "one host, shared memory with cross-memory attach: chunks drawn from a shared "
        "counter, each read straight from the peers' memory, reduced and written straight "
        "back into theirs",
    .needs = Needs::kReadAll,
    .reduces_in_cache = true,
    .averages = true,
    .cost =
        [](const CostInput& c) {
          return 4 * c.link.alpha + (c.N - 1) / c.N * c.M * (2 * c.link.beta + c.gamma);
        },
    .run = [](const Invocation& i) { allreduce_direct(i.ctx, bytes_of(i.out), i.out.numel); },
};

}  // namespace dtrain::comm::algo
