#include "comm/arguments.h"

#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace dtrain::comm {

InvalidArgumentError unsupported(const GroupInfo& info, std::string_view op, std::string_view what,
                                 std::string_view on, std::string_view why) {
  return InvalidArgumentError(fmt::format("rank {}: {}: backend {} does not support {} on {}: {}",
                                          info.rank, op, info.backend, what, on, why));
}

void check_rank_and_size(int rank, int size) {
  if (size < 1)
    throw InvalidArgumentError(fmt::format("world size is {}: it must be at least 1", size));
  if (rank < 0 || rank >= size)
    throw InvalidArgumentError(
        fmt::format("rank {} is outside the group of size {}: use 0..{}", rank, size, size - 1));
}

void check_tensor(const GroupInfo& info, const TensorView& t, std::string_view op,
                  std::string_view which) {
  if (t.device != Device::kCpu)
    throw unsupported(
        info, op, op, "CUDA tensors",
        fmt::format("{}; copy {} to the CPU, or use the nccl backend", info.no_cuda, which));
  if (t.data == nullptr && t.numel > 0)
    throw InvalidArgumentError(fmt::format("rank {}: {}: {} of {} elements has a null data pointer",
                                           info.rank, op, which, t.numel));
}

void check_wire(const GroupInfo& info, const TensorView& t, const AllreduceOptions& o) {
  if (o.wire == Wire::kExact) {
    if (o.error.numel > 0)
      throw InvalidArgumentError(fmt::format(
          "rank {}: all_reduce: an error-feedback buffer is given but the wire is exact; set "
          "wire = Wire::kInt8, kInt4, kBf16 or kFp16, or leave the error buffer empty",
          info.rank));
    return;
  }
  const std::string_view wire = to_string(o.wire);
  if (info.backend != "native")
    throw unsupported(info, "all_reduce",
                      fmt::format("{} on the wire (AllreduceOptions::wire)", wire), "any tensor",
                      "it is an algorithm of dtrain's own; use the native backend, or the exact "
                      "wire");
  if (t.dtype != DType::kF32 || (o.op != ReduceOp::kSum && o.op != ReduceOp::kAvg))
    throw InvalidArgumentError(fmt::format(
        "rank {}: all_reduce: {} on the wire takes f32 values and SUM or AVG, not {} and {}; "
        "use the exact wire for these",
        info.rank, wire, to_string(t.dtype), to_string(o.op)));
  if (o.error.numel == 0) return;
  if (o.error.dtype != DType::kF32 || o.error.numel != t.numel)
    throw InvalidArgumentError(fmt::format(
        "rank {}: all_reduce: the error-feedback buffer is {} of {} elements but the tensor has "
        "{}: give f32 of the tensor's numel (zeros at first), kept from call to call",
        info.rank, to_string(o.error.dtype), o.error.numel, t.numel));
  check_tensor(info, o.error, "all_reduce", "the error-feedback buffer");
}

void check_root(const GroupInfo& info, int root, std::string_view op) {
  if (root < 0 || root >= info.size)
    throw InvalidArgumentError(fmt::format("rank {}: {} has root {}, but group {} has ranks 0..{}",
                                           info.rank, op, root, info.name, info.size - 1));
}

void check_same_dtype(const GroupInfo& info, const TensorView& out, const TensorView& in,
                      std::string_view op) {
  if (out.dtype != in.dtype)
    throw InvalidArgumentError(
        fmt::format("rank {}: {}: output is {} but input is {}; use one dtype", info.rank, op,
                    to_string(out.dtype), to_string(in.dtype)));
}

void check_peer(const GroupInfo& info, int peer, const TensorView& tensor, std::string_view op) {
  if (peer < 0 || peer >= info.size)
    throw InvalidArgumentError(
        fmt::format("rank {}: {} names rank {}, but group {} has ranks 0..{}", info.rank, op, peer,
                    info.name, info.size - 1));
  if (peer == info.rank)
    throw InvalidArgumentError(
        fmt::format("rank {}: {} names this rank itself; copy the tensor instead", info.rank, op));
  check_tensor(info, tensor, op, "the tensor");
}

void check_new_group(const GroupInfo& info, const std::vector<int>& ranks) {
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0 || r >= info.size)
      throw InvalidArgumentError(
          fmt::format("rank {}: new_group({}) names rank {}, but group {} has ranks 0..{}",
                      info.rank, fmt::join(ranks, ", "), r, info.name, info.size - 1));
    if (!seen.insert(r).second)
      throw InvalidArgumentError(fmt::format("rank {}: new_group({}) names rank {} twice",
                                             info.rank, fmt::join(ranks, ", "), r));
  }
  if (ranks.empty())
    throw InvalidArgumentError(
        fmt::format("rank {}: new_group needs at least one rank", info.rank));
}

namespace {

// Both tensors on the CPU, of one dtype.
void check_pair(const GroupInfo& info, const TensorView& out, const TensorView& in,
                std::string_view op) {
  check_tensor(info, out, op, "the output");
  check_tensor(info, in, op, "the input");
  check_same_dtype(info, out, in, op);
}

}  // namespace

void check_allgather(const GroupInfo& info, const TensorView& out, const TensorView& in) {
  check_pair(info, out, in, "all_gather");
  const size_t n = static_cast<size_t>(info.size);
  if (out.numel != in.numel * n)
    throw InvalidArgumentError(fmt::format(
        "rank {}: all_gather: the output has {} elements; it needs size() x input = {} x {} = {}",
        info.rank, out.numel, n, in.numel, in.numel * n));
}

size_t check_allgatherv(const GroupInfo& info, const TensorView& out, const TensorView& in,
                        const std::vector<size_t>& counts) {
  check_pair(info, out, in, "all_gather_v");
  if (counts.size() != static_cast<size_t>(info.size))
    throw InvalidArgumentError(
        fmt::format("rank {}: all_gather_v: counts has {} entries; it needs one per rank ({})",
                    info.rank, counts.size(), info.size));
  size_t total = 0;
  for (size_t c : counts) total += c;
  if (in.numel != counts[info.rank] || out.numel < total)
    throw InvalidArgumentError(fmt::format(
        "rank {}: all_gather_v: the input has {} elements (counts says {}) and the output {} "
        "(the counts add up to {}); the input needs this rank's count and the output at least "
        "the sum",
        info.rank, in.numel, counts[info.rank], out.numel, total));
  return total;
}

void check_gather(const GroupInfo& info, const TensorView& out, const TensorView& in, int root) {
  check_tensor(info, in, "gather", "the input");
  check_root(info, root, "gather");
  if (info.rank != root) return;
  check_tensor(info, out, "gather", "the output");
  check_same_dtype(info, out, in, "gather");
  const size_t n = static_cast<size_t>(info.size);
  if (out.numel != in.numel * n)
    throw InvalidArgumentError(fmt::format(
        "rank {}: gather: the root's output has {} elements; it needs size() x input = {} x {} "
        "= {}",
        info.rank, out.numel, n, in.numel, in.numel * n));
}

void check_scatter(const GroupInfo& info, const TensorView& out, const TensorView& in, int root) {
  check_tensor(info, out, "scatter", "the output");
  check_root(info, root, "scatter");
  if (info.rank != root) return;
  check_tensor(info, in, "scatter", "the input");
  check_same_dtype(info, out, in, "scatter");
  const size_t n = static_cast<size_t>(info.size);
  if (in.numel != out.numel * n)
    throw InvalidArgumentError(fmt::format(
        "rank {}: scatter: the root's input has {} elements; it needs size() x output = {} x {} "
        "= {}",
        info.rank, in.numel, n, out.numel, out.numel * n));
}

void check_reduce_scatter(const GroupInfo& info, const TensorView& out, const TensorView& in) {
  check_pair(info, out, in, "reduce_scatter");
  const size_t n = static_cast<size_t>(info.size);
  if (in.numel != out.numel * n)
    throw InvalidArgumentError(fmt::format(
        "rank {}: reduce_scatter: the input has {} elements; it needs size() x output = {} x {} "
        "= {}",
        info.rank, in.numel, n, out.numel, out.numel * n));
}

void check_alltoall(const GroupInfo& info, const TensorView& out, const TensorView& in) {
  check_pair(info, out, in, "all_to_all");
  if (in.numel != out.numel || in.numel % static_cast<size_t>(info.size) != 0)
    throw InvalidArgumentError(fmt::format(
        "rank {}: all_to_all: input ({}) and output ({}) must have the same number of elements, "
        "divisible by the group size {}",
        info.rank, in.numel, out.numel, info.size));
}

std::string AlltoallvTotals::describe(DType dtype) const {
  return fmt::format("{}, sends {} elements, receives {}", to_string(dtype), in, out);
}

AlltoallvTotals check_alltoallv(const GroupInfo& info, const TensorView& out,
                                const std::vector<size_t>& out_counts, const TensorView& in,
                                const std::vector<size_t>& in_counts) {
  check_pair(info, out, in, "all_to_all_v");
  if (out_counts.size() != static_cast<size_t>(info.size) ||
      in_counts.size() != static_cast<size_t>(info.size))
    throw InvalidArgumentError(fmt::format(
        "rank {}: all_to_all_v: output_counts has {} and input_counts {} entries; both need one "
        "per rank ({})",
        info.rank, out_counts.size(), in_counts.size(), info.size));
  AlltoallvTotals totals;
  for (int i = 0; i < info.size; ++i) {
    totals.out += out_counts[i];
    totals.in += in_counts[i];
  }
  if (totals.out > out.numel || totals.in > in.numel)
    throw InvalidArgumentError(fmt::format(
        "rank {}: all_to_all_v: the counts add up to {} output and {} input elements, but the "
        "tensors have {} and {}",
        info.rank, totals.out, totals.in, out.numel, in.numel));
  if (out_counts[info.rank] != in_counts[info.rank])
    throw InvalidArgumentError(
        fmt::format("rank {}: all_to_all_v: this rank sends itself {} elements but expects {}",
                    info.rank, in_counts[info.rank], out_counts[info.rank]));
  return totals;
}

}  // namespace dtrain::comm
