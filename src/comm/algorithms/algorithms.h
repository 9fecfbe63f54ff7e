// The collective algorithms, one file each (each opens with how it works and its cost in the
// alpha-beta-gamma model: alpha per message, beta per byte moved, gamma per byte reduced, and
// ends with its descriptor: algorithm.h).
// Ranks are group ranks; buffers are raw bytes whose element type is ctx.call().dtype.
// Reductions treat AVG as SUM: the caller divides once at the end, but for the algorithms whose
// descriptor says `averages` (algorithm.h), which divide as they go.
#pragma once

#include <cstddef>
#include <span>
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
// A group split into parts (the ranks of one host, or of one rack) for the hierarchical
// algorithms (allreduce_hierarchical.cc). Any placement of ranks on parts; parts of equal size
// ("uniform") or not.
struct Hierarchy {
  ProcessGroup* local = nullptr;  // this rank's part
  // Uniform: the ranks of every part with this rank's index in its part. Uneven: the parts'
  // first ranks (the leaders); null on the other ranks.
  ProcessGroup* cross = nullptr;
  bool uniform = true;
  int my_part = 0;         // this rank's part
  std::vector<int> part;   // of every group rank: its part, parts in order of their first rank
  std::vector<int> index;  // of every group rank: its index within its part
  std::vector<int> order;  // group ranks by (part, index); empty when that is 0, 1, 2, ...
};
// Across parts: reduce-scatter inside each part, all-reduce of the slices across parts, all-gather
// inside each part (uniform); or reduce to each part's leader, all-reduce among the leaders,
// broadcast inside each part (uneven).
void allreduce_hierarchical(const Hierarchy& h, const TensorView& tensor, ReduceOp op,
                            const Deadline& deadline);
// The same structure for broadcast (across parts, then inside each) and all-gather (inside each
// part, across parts among their first ranks, then a broadcast inside each; uniform parts).
void broadcast_hierarchical(const Hierarchy& h, const TensorView& tensor, int root,
                            const Deadline& deadline);
void allgather_hierarchical(const Hierarchy& h, const TensorView& output, const TensorView& input,
                            const Deadline& deadline);

// Ring reduce-scatter, in place on `data` (count elements cut into size() segments): rank r ends
// holding the reduction of segment r, divided by `divide_by` (an average's) chunk by chunk as each
// is final. Ring all-gather of those segments completes an all-reduce.
void reduce_scatter_ring(CollectiveContext& ctx, std::byte* data, size_t count,
                         size_t divide_by = 1);

// broadcast of `bytes` from ctx.call().root
void broadcast_tree(CollectiveContext& ctx, std::byte* data, size_t bytes);
void broadcast_scatter_allgather(CollectiveContext& ctx, std::byte* data, size_t count);

// reduce to ctx.call().root, in place (count elements)
void reduce_tree(CollectiveContext& ctx, std::byte* data, size_t count);
void reduce_ring(CollectiveContext& ctx, std::byte* data, size_t count);

// all-gather into `out`, where rank i's block is bytes [offsets[i], offsets[i] + sizes[i]) and
// this rank's block is already in place.
void allgather_ring(CollectiveContext& ctx, std::byte* out, std::span<const size_t> offsets,
                    std::span<const size_t> sizes);
// Equal blocks of `block` bytes; any number of ranks (Bruck's recursive doubling).
void allgather_bruck(CollectiveContext& ctx, std::byte* out, size_t block);

// gather to / scatter from root, blocks of `block` bytes in rank order
void gather_linear(CollectiveContext& ctx, std::byte* out, const std::byte* in, size_t block);
void scatter_linear(CollectiveContext& ctx, std::byte* out, const std::byte* in, size_t block);

// all-to-all: block j of `in` (in_offsets[j], in_sizes[j]) goes to rank j; block i of `out`
// comes from rank i.
void alltoall_pairwise(CollectiveContext& ctx, std::byte* out, std::span<const size_t> out_offsets,
                       std::span<const size_t> out_sizes, const std::byte* in,
                       std::span<const size_t> in_offsets, std::span<const size_t> in_sizes);

void barrier_dissemination(CollectiveContext& ctx);

}  // namespace dtrain::comm::algo
