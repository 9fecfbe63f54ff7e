// Hierarchical all-reduce, for a group spread over several hosts with k ranks on each: a
// reduce-scatter among the k ranks of each host (shared memory), an all-reduce of each 1/k slice
// among the ranks holding it on the other hosts (TCP, one rank per host per slice, all slices
// at once), then an all-gather inside each host. The slow links carry only 2(h-1)/h of M/k per
// rank instead of the flat ring's 2(N-1)/N of M.
//
// Cost (h hosts, k ranks each, local constants for the steps inside a host):
//   2 [(k-1) alpha_l + (k-1)/k M beta_l] + 2 (h-1) alpha + 2 (h-1)/h (M/k) beta + gamma terms.
// Elements beyond the largest multiple of k are all-reduced inside, then across, directly.
// Broadcast and all-gather take the same shape (see algorithms.h).
#include <algorithm>

#include "comm/algorithms/algorithms.h"

namespace dtrain::comm::algo {

void allreduce_hierarchical(ProcessGroup& local, ProcessGroup& cross, const TensorView& t,
                            ReduceOp op, const Deadline& deadline) {
  // AVG is a sum here: the caller divides once by the whole group's size.
  const ReduceOp step = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  const size_t k = static_cast<size_t>(local.size());
  const size_t block = t.numel / k;
  const size_t elem = element_size(t.dtype);
  auto* data = static_cast<std::byte*>(t.data);
  auto left = [&] { return std::max(deadline.remaining(), std::chrono::milliseconds(1)); };
  if (block > 0) {
    const TensorView all{t.data, block * k, t.dtype};
    const TensorView mine{data + static_cast<size_t>(local.rank()) * block * elem, block, t.dtype};
    local.reduce_scatter(mine, all, {.op = step, .timeout = left()})->wait();
    cross.allreduce(mine, {.op = step, .timeout = left()})->wait();
    local.allgather(all, mine, {.timeout = left()})->wait();
  }
  if (const size_t rest = t.numel - block * k; rest > 0) {
    const TensorView tail{data + block * k * elem, rest, t.dtype};
    local.allreduce(tail, {.op = step, .timeout = left()})->wait();
    cross.allreduce(tail, {.op = step, .timeout = left()})->wait();
  }
}

void broadcast_hierarchical(ProcessGroup& local, ProcessGroup& cross, const TensorView& t,
                            int root_host, int root_index, const Deadline& deadline) {
  auto left = [&] { return std::max(deadline.remaining(), std::chrono::milliseconds(1)); };
  if (local.rank() == root_index) cross.broadcast(t, {.root = root_host, .timeout = left()})->wait();
  local.broadcast(t, {.root = root_index, .timeout = left()})->wait();
}

void allgather_hierarchical(ProcessGroup& local, ProcessGroup& cross, const TensorView& out,
                            const TensorView& in, const Deadline& deadline) {
  auto left = [&] { return std::max(deadline.remaining(), std::chrono::milliseconds(1)); };
  const size_t k = static_cast<size_t>(local.size());
  const size_t host_block = in.numel * k;
  const size_t host = static_cast<size_t>(cross.rank());  // hosts hold consecutive ranks
  const TensorView mine{static_cast<std::byte*>(out.data) + host * host_block * element_size(in.dtype),
                        host_block, in.dtype};
  local.allgather(mine, in, {.timeout = left()})->wait();
  if (local.rank() == 0) cross.allgather(out, mine, {.timeout = left()})->wait();
  local.broadcast(out, {.root = 0, .timeout = left()})->wait();
}

}  // namespace dtrain::comm::algo
