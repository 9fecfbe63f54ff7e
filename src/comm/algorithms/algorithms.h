// The collective algorithms, one file each (each opens with how it works and its cost in the
// alpha-beta-gamma model: alpha per message, beta per byte moved, gamma per byte reduced).
// Ranks are group ranks; buffers are raw bytes whose element type is ctx.call().dtype.
// Reductions treat AVG as SUM: the caller divides once at the end.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/collective.h"
#include "dtrain/process_group.h"

namespace dtrain::comm::algo {

// Segment i of a buffer of `count` elements cut into `parts` nearly equal pieces.
struct Segment {
  size_t offset = 0;  // elements
  size_t count = 0;
};
Segment segment(size_t count, int parts, int i);

// all-reduce, in place on `data` (count elements)
void allreduce_ring(CollectiveContext& ctx, std::byte* data, size_t count);
void allreduce_halving_doubling(CollectiveContext& ctx, std::byte* data, size_t count);
void allreduce_recursive_doubling(CollectiveContext& ctx, std::byte* data, size_t count);
void allreduce_central(CollectiveContext& ctx, std::byte* data, size_t count);
// Ranks of one host reading each other's buffers (needs ctx.can_read_all()).
void allreduce_direct(CollectiveContext& ctx, std::byte* data, size_t count);
// Across hosts: reduce-scatter inside the host, all-reduce of the slices across hosts, all-gather
// inside the host, through the group's `local` and `cross` sub-groups.
void allreduce_hierarchical(ProcessGroup& local, ProcessGroup& cross, const TensorView& tensor,
                            ReduceOp op, const Deadline& deadline);
// The same structure for broadcast (across hosts among the ranks with the root's local index,
// then inside each host) and all-gather (inside each host, across hosts among the first ranks of
// the hosts, then a broadcast inside each host; needs hosts holding consecutive ranks).
void broadcast_hierarchical(ProcessGroup& local, ProcessGroup& cross, const TensorView& tensor,
                            int root_host, int root_index, const Deadline& deadline);
void allgather_hierarchical(ProcessGroup& local, ProcessGroup& cross, const TensorView& output,
                            const TensorView& input, const Deadline& deadline);

// Ring reduce-scatter, in place on `data` (count elements cut into size() segments): rank r ends
// holding the reduction of segment r. Ring all-gather of those segments completes an all-reduce.
void reduce_scatter_ring(CollectiveContext& ctx, std::byte* data, size_t count);

// broadcast of `bytes` from ctx.call().root
void broadcast_tree(CollectiveContext& ctx, std::byte* data, size_t bytes);
void broadcast_scatter_allgather(CollectiveContext& ctx, std::byte* data, size_t count);

// reduce to ctx.call().root, in place (count elements)
void reduce_tree(CollectiveContext& ctx, std::byte* data, size_t count);
void reduce_ring(CollectiveContext& ctx, std::byte* data, size_t count);

// all-gather into `out`, where rank i's block is bytes [offsets[i], offsets[i] + sizes[i]) and
// this rank's block is already in place.
void allgather_ring(CollectiveContext& ctx, std::byte* out, const std::vector<size_t>& offsets,
                    const std::vector<size_t>& sizes);
// Equal blocks of `block` bytes; any number of ranks (Bruck's recursive doubling).
void allgather_bruck(CollectiveContext& ctx, std::byte* out, size_t block);

// gather to / scatter from root, blocks of `block` bytes in rank order
void gather_linear(CollectiveContext& ctx, std::byte* out, const std::byte* in, size_t block);
void scatter_linear(CollectiveContext& ctx, std::byte* out, const std::byte* in, size_t block);

// all-to-all: block j of `in` (in_offsets[j], in_sizes[j]) goes to rank j; block i of `out`
// comes from rank i.
void alltoall_pairwise(CollectiveContext& ctx, std::byte* out, const std::vector<size_t>& out_offsets,
                       const std::vector<size_t>& out_sizes, const std::byte* in,
                       const std::vector<size_t>& in_offsets, const std::vector<size_t>& in_sizes);

void barrier_dissemination(CollectiveContext& ctx);

}  // namespace dtrain::comm::algo
