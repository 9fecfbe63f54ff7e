// Ring all-reduce: a ring reduce-scatter followed by a ring all-gather (Patarasuk & Yuan).
//
// The buffer is cut into N segments. In N-1 reduce-scatter steps each rank sends one segment to
// its right neighbour and reduces the one arriving from its left, so that rank r ends with
// segment r fully reduced; in N-1 all-gather steps the reduced segments travel once around the
// ring. Segments move in chunks, and a chunk is forwarded as soon as it is reduced (or, in the
// all-gather, as soon as it arrives), so sending, receiving and reducing overlap. Over TCP a
// chunk is added into place as it comes off the socket (Pair::irecv_reduce), with no scratch.
//
// Cost: 2(N-1) alpha + 2(N-1)/N M beta + (N-1)/N M gamma. Bandwidth-optimal; the latency term
// grows with N, so small messages prefer recursive doubling.
#include <algorithm>
#include <cstring>

#include "comm/algorithms/algorithm.h"
#include "comm/algorithms/algorithms.h"
#include "common/reduce.h"

namespace dtrain::comm::algo {
namespace {

constexpr size_t kChunkBytes = size_t{256} << 10;

struct Chunk {
  size_t offset;  // elements
  size_t count;
};

std::vector<Chunk> chunks_of(Segment s, size_t elem) {
  std::vector<Chunk> out;
  const size_t per = std::max<size_t>(1, kChunkBytes / elem);
  for (size_t off = 0; off < s.count; off += per)
    out.push_back({s.offset + off, std::min(per, s.count - off)});
  if (out.empty()) out.push_back({s.offset, 0});
  return out;
}

}  // namespace

Segment segment(size_t count, int parts, int i) {
  const size_t base = count / parts, extra = count % parts;
  const size_t idx = static_cast<size_t>(i);
  return {idx * base + std::min(idx, extra), base + (idx < extra ? 1 : 0)};
}

void reduce_scatter_ring(CollectiveContext& ctx, std::byte* data, size_t count, size_t divide_by) {
  const int n = ctx.size(), r = ctx.rank();
  if (n == 1) return;
  const size_t elem = ctx.element_size();
  const int right = (r + 1) % n, left = (r - 1 + n) % n;
  auto seg = [&](int i) { return segment(count, n, ((i % n) + n) % n); };
  const size_t max_seg_bytes = segment(count, n, 0).count * elem;
  // Over TCP the pair reduces each chunk into `data` as it arrives (Pair::irecv_reduce): no
  // segment is sent before it has been received into, so nothing else touches it meanwhile.
  const bool reducing = !ctx.on_shared_memory(left);
  std::byte* scratch = reducing ? nullptr : ctx.scratch(2 * max_seg_bytes);
  // Shared memory: where chunk `c` of step s's segment lands (the halves alternate by step).
  auto landing = [&](int s, const Segment& in_seg, const Chunk& c) {
    return scratch + (s % 2) * max_seg_bytes + (c.offset - in_seg.offset) * elem;
  };

  // Step s sends segment r-s-1 and receives segment r-s-2; after N-1 steps segment r is done.
  // Receives for step s+1 are posted (on shared memory into the other half of the scratch)
  // before step s is reduced, so the next segment streams in while this one is being added up.
  std::vector<CollectiveContext::RequestPtr> sends;
  for (const Chunk& c : chunks_of(seg(r - 1), elem))
    sends.push_back(ctx.send(right, data + c.offset * elem, c.count * elem));
  auto post_recvs = [&](int s) {
    const Segment in_seg = seg(r - s - 2);
    std::vector<CollectiveContext::RequestPtr> recvs;
    for (const Chunk& c : chunks_of(in_seg, elem))
      recvs.push_back(reducing ? ctx.recv_reduce(left, data + c.offset * elem, c.count * elem)
                               : ctx.recv(left, landing(s, in_seg, c), c.count * elem));
    return recvs;
  };
  auto recvs = post_recvs(0);
  for (int s = 0; s < n - 1; ++s) {
    const Segment in_seg = seg(r - s - 2);
    auto next = s + 1 < n - 1 ? post_recvs(s + 1) : std::vector<CollectiveContext::RequestPtr>{};
    const auto chunks = chunks_of(in_seg, elem);
    for (size_t i = 0; i < chunks.size(); ++i) {
      ctx.wait(recvs[i]);
      const Chunk& c = chunks[i];
      if (!reducing)
        reduce_into(data + c.offset * elem, landing(s, in_seg, c), c.count, ctx.call().dtype,
                    ctx.call().op);
      // The reduced chunk is what the next step sends: forward it at once.
      if (s + 1 < n - 1) {
        sends.push_back(ctx.send(right, data + c.offset * elem, c.count * elem));
      } else if (divide_by > 1) {  // this rank's segment, final: divided while in cache
        scale_down(data + c.offset * elem, c.count, ctx.call().dtype, divide_by);
      }
    }
    recvs = std::move(next);
  }
  ctx.wait(sends);
}

void allreduce_ring(CollectiveContext& ctx, std::byte* data, size_t count) {
  const int n = ctx.size(), r = ctx.rank();
  if (n == 1) return;
  reduce_scatter_ring(ctx, data, count,
                      ctx.call().op == ReduceOp::kAvg ? static_cast<size_t>(n) : 1);
  const size_t elem = ctx.element_size();
  const int right = (r + 1) % n, left = (r - 1 + n) % n;
  auto seg = [&](int i) { return segment(count, n, ((i % n) + n) % n); };

  // All-gather: step s sends segment r-s and receives r-s-1, forwarding each chunk on arrival.
  std::vector<CollectiveContext::RequestPtr> sends;
  for (const Chunk& c : chunks_of(seg(r), elem))
    sends.push_back(ctx.send(right, data + c.offset * elem, c.count * elem));
  for (int s = 0; s < n - 1; ++s) {
    const auto chunks = chunks_of(seg(r - s - 1), elem);
    std::vector<CollectiveContext::RequestPtr> recvs;
    for (const Chunk& c : chunks)
      recvs.push_back(ctx.recv(left, data + c.offset * elem, c.count * elem));
    for (size_t i = 0; i < chunks.size(); ++i) {
      ctx.wait(recvs[i]);
      if (s + 1 < n - 1)
        sends.push_back(ctx.send(right, data + chunks[i].offset * elem, chunks[i].count * elem));
    }
  }
  ctx.wait(sends);
}

extern const Algorithm kAllreduceRing{
    .name = "ring",
    .kind = CollectiveKind::kAllreduce,
    .file = "allreduce_ring.cc",
    .formula = "2(N-1) alpha + 2(N-1)/N M beta + (N-1)/N M gamma",
    .chosen = "large buffers (bandwidth-optimal; chunks pipelined)",
    .flows = Flows::kOnePerHost,
    .averages = true,
    .cost =
        [](const CostInput& c) {
          const auto [al, be] = c.link;
          return 2 * (c.N - 1) * al +
                 2 * (c.N - 1) / c.N * ((1 + c.reread) * c.M * be + c.chunks * al) +
                 (c.N - 1) / c.N * c.M * c.gamma;
        },
    .run = [](const Invocation& i) { allreduce_ring(i.ctx, bytes_of(i.out), i.out.numel); },
};

// Reduces a copy of the input (the caller's stays as it was) and keeps this rank's block: a
// copy in and a copy out beside the ring's trips (CostInput::trip copies each).
extern const Algorithm kReduceScatterRing{
    .name = "ring",
    .kind = CollectiveKind::kReduceScatter,
    .file = "allreduce_ring.cc",
    .formula = "(N-1) alpha + (N-1)/N M (t beta + gamma) + (N+1)/N M beta, t copies a trip",
    .chosen = "across hosts, and small buffers on one (the direct form's two rounds cost more)",
    .flows = Flows::kOnePerHost,
    .cost =
        [](const CostInput& c) {
          return (c.N - 1) * c.link.alpha +
                 (c.N - 1) / c.N *
                     ((c.trip + c.reread) * c.M * c.link.beta + c.chunks * c.link.alpha) +
                 (c.N - 1) / c.N * c.M * c.gamma + (c.N + 1) / c.N * c.M * c.link.beta;
        },
    .run =
        [](const Invocation& i) {
          const size_t bytes = i.in.nbytes();
          std::byte* work = i.ctx.workspace(bytes);
          if (bytes > 0) std::memcpy(work, i.in.data, bytes);
          reduce_scatter_ring(i.ctx, work, i.in.numel);
          const size_t block = i.out.nbytes();
          if (block > 0) std::memcpy(i.out.data, work + i.ctx.rank() * block, block);
        },
};

}  // namespace dtrain::comm::algo
