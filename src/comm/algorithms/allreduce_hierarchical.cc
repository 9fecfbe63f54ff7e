// Hierarchical collectives, for a group split into parts: the ranks of each host (shared memory
// inside, the network between), or of each rack (a rack's switch inside, its uplink between).
// Ranks may sit on the parts in any order.
//
// Parts of equal size k (h parts): a reduce-scatter among the k ranks of each part, an
// all-reduce of each 1/k slice among the ranks holding it in the other parts (one rank per part
// per slice, all slices at once), then an all-gather inside each part. The slow links carry
// 2(h-1)/h of M per part instead of the flat ring's 2(N-1)/N of M per rank.
//   Cost: 2 [(k-1) alpha_in + (k-1)/k M beta_in] + cross(M/k over h, k groups at once) + gamma.
// Uneven parts: the leaders (each part's first rank) do the work across: a reduce to the leader
// inside each part, an all-reduce among the leaders, a broadcast inside each part.
//   Cost: 2 log2(k) (alpha_in + M beta_in) + cross(M over h) + gamma.
// The cross step is itself a collective of its own group, which the cost model gives its own
// algorithm: a rack-level hierarchy where the hosts sit in racks (a 2-D scheme), recursive
// doubling where messages are small and latency rules (the tree-like exchange), a ring where
// they are large. Elements beyond the largest multiple of k are all-reduced inside, then across,
// directly. Broadcast and all-gather take the same shape.
#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/algorithms/algorithm.h"
#include "comm/algorithms/algorithms.h"

namespace dtrain::comm::algo {
namespace {

std::chrono::milliseconds left(const Deadline& deadline) {
  return std::max(deadline.remaining(), std::chrono::milliseconds(1));
}

}  // namespace

void allreduce_hierarchical(const Hierarchy& h, const TensorView& t, ReduceOp op,
                            const Deadline& deadline) {
  // AVG is a sum here: the caller divides once by the whole group's size.
  const ReduceOp step = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  ProcessGroup& local = *h.local;
  if (!h.uniform) {
    local.reduce(t, {.root = 0, .op = step, .timeout = left(deadline)})->wait();
    if (h.cross) h.cross->allreduce(t, {.op = step, .timeout = left(deadline)})->wait();
    local.broadcast(t, {.root = 0, .timeout = left(deadline)})->wait();
    return;
  }
  ProcessGroup& cross = *h.cross;
  const size_t k = static_cast<size_t>(local.size());
  const size_t block = t.numel / k;
  const size_t elem = element_size(t.dtype);
  auto* data = static_cast<std::byte*>(t.data);
  if (block > 0) {
    const TensorView all{t.data, block * k, t.dtype};
    const TensorView mine{data + static_cast<size_t>(local.rank()) * block * elem, block, t.dtype};
    local.reduce_scatter(mine, all, {.op = step, .timeout = left(deadline)})->wait();
    cross.allreduce(mine, {.op = step, .timeout = left(deadline)})->wait();
    local.allgather(all, mine, {.timeout = left(deadline)})->wait();
  }
  if (const size_t rest = t.numel - block * k; rest > 0) {
    const TensorView tail{data + block * k * elem, rest, t.dtype};
    local.allreduce(tail, {.op = step, .timeout = left(deadline)})->wait();
    cross.allreduce(tail, {.op = step, .timeout = left(deadline)})->wait();
  }
}

void broadcast_hierarchical(const Hierarchy& h, const TensorView& t, int root,
                            const Deadline& deadline) {
  ProcessGroup& local = *h.local;
  const int root_part = h.part[root], root_index = h.index[root];
  if (h.uniform) {
    // The cross group of the root's index holds one rank of every part, the root among them.
    if (local.rank() == root_index)
      h.cross->broadcast(t, {.root = root_part, .timeout = left(deadline)})->wait();
    local.broadcast(t, {.root = root_index, .timeout = left(deadline)})->wait();
    return;
  }
  // Leaders: the root's part first (so that its leader holds the data), then the leaders, then
  // every other part from its leader.
  if (h.my_part == root_part)
    local.broadcast(t, {.root = root_index, .timeout = left(deadline)})->wait();
  if (h.cross) h.cross->broadcast(t, {.root = root_part, .timeout = left(deadline)})->wait();
  if (h.my_part != root_part) local.broadcast(t, {.root = 0, .timeout = left(deadline)})->wait();
}

void allgather_hierarchical(const Hierarchy& h, const TensorView& out, const TensorView& in,
                            const Deadline& deadline) {
  ProcessGroup& local = *h.local;
  const size_t k = static_cast<size_t>(local.size());
  const size_t bytes = in.nbytes();  // one rank's block
  const size_t n = h.part.size();
  // Gathered by (part, index), then put in rank order where the placement is not that order.
  std::vector<std::byte> staging(h.order.empty() ? 0 : n * bytes);
  auto* stage = h.order.empty() ? static_cast<std::byte*>(out.data) : staging.data();
  const TensorView all{stage, in.numel * n, in.dtype};
  const TensorView mine{stage + static_cast<size_t>(h.my_part) * k * bytes, in.numel * k, in.dtype};
  local.allgather(mine, in, {.timeout = left(deadline)})->wait();
  // The cross group of index 0: the first rank of every part.
  if (local.rank() == 0) h.cross->allgather(all, mine, {.timeout = left(deadline)})->wait();
  local.broadcast(all, {.root = 0, .timeout = left(deadline)})->wait();
  if (!h.order.empty())
    for (size_t pos = 0; pos < n; ++pos)
      std::memcpy(static_cast<std::byte*>(out.data) + static_cast<size_t>(h.order[pos]) * bytes,
                  stage + pos * bytes, bytes);
}

extern const Algorithm kAllreduceHierarchical{
    .name = "hierarchical",
    .kind = CollectiveKind::kAllreduce,
    .file = "allreduce_hierarchical.cc",
    .formula =
        "2[(k-1) alpha_in + (k-1)/k M beta_in] + cross(M/k over h, k groups sharing the "
        "links); uneven: 2 ceil(log2 k)(alpha_in + M beta_in) + cross(M over h)",
    .chosen =
        "h hosts (or racks), any placement of ranks: reduce-scatter inside, all-reduce "
        "across (itself split by rack where the hosts sit in racks), all-gather inside; "
        "hosts of different sizes by their leaders",
    .needs = Needs::kParts,
    .run =
        [](const Invocation& i) {
          allreduce_hierarchical(*i.hierarchy, i.out, i.op, i.ctx.deadline());
        },
};

extern const Algorithm kBroadcastHierarchical{
    .name = "hierarchical",
    .kind = CollectiveKind::kBroadcast,
    .file = "allreduce_hierarchical.cc",
    .formula = "cross(M over h) + ceil(log2 k)(alpha_in + M beta_in)",
    .chosen = "several hosts: across first, then inside each",
    .needs = Needs::kParts,
    .run =
        [](const Invocation& i) {
          broadcast_hierarchical(*i.hierarchy, i.out, i.root, i.ctx.deadline());
        },
};

extern const Algorithm kAllgatherHierarchical{
    .name = "hierarchical",
    .kind = CollectiveKind::kAllgather,
    .file = "allreduce_hierarchical.cc",
    .formula =
        "(k-1)(alpha_in + M beta_in) + cross(k M over h) + ceil(log2 k)(alpha_in + N M "
        "beta_in)",
    .chosen = "several hosts with the same number of ranks, any placement",
    .needs = Needs::kUniformParts,
    .run =
        [](const Invocation& i) {
          allgather_hierarchical(*i.hierarchy, i.out, i.in, i.ctx.deadline());
        },
};

}  // namespace dtrain::comm::algo
