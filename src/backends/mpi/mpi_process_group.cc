#include "backends/mpi/mpi_process_group.h"

#include <climits>
#include <cstring>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/mpi/mpi_runtime.h"
#include "backends/registry.h"
#include "common/env.h"
#include "common/log.h"
#include "common/reduce.h"
#include "dtrain/error.h"

namespace dtrain::backends::mpi {
namespace {

std::string message_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& err) {
    return err.what();
  } catch (...) {
    return "unknown error";
  }
}

std::string describe(const TensorView& t) {
  return fmt::format("{} x {} ({} bytes)", to_string(t.dtype), t.numel, t.nbytes());
}

uint64_t fnv1a(const std::vector<int>& ranks) {
  uint64_t h = 1469598103934665603ull;
  for (int r : ranks)
    for (int i = 0; i < 4; ++i) h = (h ^ ((static_cast<uint32_t>(r) >> (8 * i)) & 0xffu)) * 1099511628211ull;
  return h;
}

int tag_upper_bound() {
  void* value = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &flag);
  return flag ? *static_cast<int*>(value) : 32767;
}

}  // namespace

MpiProcessGroup::MpiProcessGroup(int rank, int size, const ProcessGroupOptions& options)
    : name_(options.name) {
  ensure_initialized();
  timeout_ = options.timeout.count() > 0 ? options.timeout : env::get_seconds(env::kTimeout);
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if ((rank >= 0 && rank != world_rank) || (size >= 0 && size != world_size))
    throw InvalidArgumentError(fmt::format(
        "backend mpi: asked for rank {} of {}, but mpirun started this process as rank {} of {}; "
        "with the mpi backend ranks come from mpirun (pass -1 or the same)", rank, size,
        world_rank, world_size));
  rank_ = world_rank;
  size_ = world_size;
  // A duplicate keeps our messages apart from the application's own MPI traffic. MPI_Comm_idup
  // (not MPI_Comm_dup) so that a rank that never arrives cannot block us past the limit.
  const auto connect = options.connect_timeout.count() > 0 ? options.connect_timeout
                                                           : env::get_seconds(env::kConnectTimeout);
  MpiWork dup(MpiWork::Kind::kCollective,
              fmt::format("rank {}: MPI_Comm_idup of MPI_COMM_WORLD ({} ranks) for group {} (mpi)",
                          rank_, size_, name_),
              Deadline::after(connect), nullptr);
  int rc;
  {
    CallLock call;
    rc = MPI_Comm_idup(MPI_COMM_WORLD, &comm_, dup.request());
  }
  if (rc != MPI_SUCCESS)
    throw PeerFailureError(fmt::format("rank {}: backend mpi: MPI_Comm_idup failed: {}", rank_,
                                       error_string(rc)));
  dup.wait(std::nullopt);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

MpiProcessGroup::MpiProcessGroup(MPI_Comm comm, std::string name, std::chrono::milliseconds timeout)
    : comm_(comm), name_(std::move(name)), timeout_(timeout) {
  CallLock call;
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

MpiProcessGroup::~MpiProcessGroup() {
  std::vector<std::weak_ptr<MpiWork>> pending;
  bool stuck;
  {
    std::lock_guard lock(mu_);
    pending.swap(pending_);
    stuck = failure_ != nullptr;
  }
  auto error = std::make_exception_ptr(
      AbortedError(fmt::format("rank {}: group {} (mpi) was destroyed", rank_, name_)));
  for (auto& w : pending)
    if (auto work = w.lock()) work->cancel(error);
  // A communicator with abandoned requests is left alone: freeing it could wait on them.
  if (!stuck && comm_ != MPI_COMM_NULL && !finalized()) {
    CallLock call;
    MPI_Comm_free(&comm_);
  }
}

void MpiProcessGroup::mark_failed(std::exception_ptr error) {
  std::lock_guard lock(mu_);
  if (!failure_) failure_ = std::move(error);
}

// ---- validation ----

void MpiProcessGroup::check_tensor(const TensorView& t, const char* op, const char* which) const {
  if (t.device != Device::kCpu)
    throw InvalidArgumentError(fmt::format(
        "rank {}: {}: backend mpi does not support {} on CUDA tensors: Debian's OpenMPI is not "
        "CUDA-aware; copy {} to the CPU, or use the nccl backend", rank_, op, op, which));
  if (t.data == nullptr && t.numel > 0)
    throw InvalidArgumentError(fmt::format("rank {}: {}: {} of {} elements has a null data pointer",
                                           rank_, op, which, t.numel));
}

void MpiProcessGroup::check_root(int root, const char* op) const {
  if (root < 0 || root >= size_)
    throw InvalidArgumentError(fmt::format("rank {}: {} has root {}, but group {} has ranks 0..{}",
                                           rank_, op, root, name_, size_ - 1));
}

void MpiProcessGroup::check_same_dtype(const TensorView& a, const TensorView& b,
                                       const char* op) const {
  if (a.dtype != b.dtype)
    throw InvalidArgumentError(fmt::format("rank {}: {}: output is {} but input is {}; use one dtype",
                                           rank_, op, to_string(a.dtype), to_string(b.dtype)));
}

void MpiProcessGroup::check_algorithm(const std::string& algorithm, const char* op) const {
  if (!algorithm.empty())
    throw InvalidArgumentError(fmt::format(
        "rank {}: {}: backend mpi does not support algorithm '{}' on CPU tensors: MPI chooses its "
        "own (OpenMPI: --mca coll_tuned_*); leave the algorithm empty", rank_, op, algorithm));
}

int MpiProcessGroup::check_count(size_t count, const char* op) const {
  if (count > static_cast<size_t>(INT_MAX))
    throw InvalidArgumentError(fmt::format(
        "rank {}: {}: backend mpi does not support {} of more than {} elements (MPI counts are "
        "int) on CPU tensors; got {}: split the call", rank_, op, op, INT_MAX, count));
  return static_cast<int>(count);
}

MPI_Datatype MpiProcessGroup::reduction_type(DType dtype, ReduceOp op, const char* name) const {
  auto type = datatype_of(dtype);
  if (!type)
    throw InvalidArgumentError(fmt::format(
        "rank {}: {}: backend mpi does not support {} of {} on CPU tensors: MPI has no 16-bit "
        "floating-point type; use f32, or the gloo (f16) or native backend", rank_, name, name,
        to_string(dtype)));
  check_reduce_op(dtype, op);
  return *type;
}

// ---- issuing ----

std::shared_ptr<Work> MpiProcessGroup::start(MpiWork::Kind kind, const char* op,
                                             const std::string& desc,
                                             std::chrono::milliseconds timeout, const Start& body) {
  std::weak_ptr<MpiProcessGroup> self = weak_from_this();
  auto on_stuck = [self](std::exception_ptr e) {
    if (auto group = self.lock()) group->mark_failed(e);
  };
  // Held while issuing: collectives reach MPI in the order of their sequence numbers.
  std::lock_guard lock(mu_);
  std::string what =
      kind == MpiWork::Kind::kCollective
          ? fmt::format("rank {}: {} of {} as collective #{} of group {} (mpi)", rank_, op, desc,
                        ++next_seq_, name_)
          : fmt::format("rank {}: {} {} of group {} (mpi)", rank_, op, desc, name_);
  auto work = std::make_shared<MpiWork>(kind, what,
                                        Deadline::after(timeout.count() > 0 ? timeout : timeout_),
                                        std::move(on_stuck));
  if (failure_) {
    work->fail_start(std::make_exception_ptr(PeerFailureError(fmt::format(
        "{} cannot start: the group is unusable since: {}", what, message_of(failure_)))));
    return work;
  }
  int rc;
  {
    CallLock call;
    rc = body(*work);
  }
  if (rc != MPI_SUCCESS) {
    work->fail_start(std::make_exception_ptr(
        PeerFailureError(fmt::format("{} could not start: {}", what, error_string(rc)))));
    return work;
  }
  std::erase_if(pending_, [](const auto& w) { return w.expired(); });
  pending_.push_back(work);
  return work;
}

// ---- point to point ----

std::shared_ptr<Work> MpiProcessGroup::isend(const TensorView& t, int dst, int tag,
                                             const SendOptions& o) {
  if (dst < 0 || dst >= size_ || dst == rank_)
    throw InvalidArgumentError(fmt::format(
        "rank {}: send names rank {}, but group {} has ranks 0..{} and a rank cannot send to "
        "itself", rank_, dst, name_, size_ - 1));
  if (tag < 0 || tag > tag_upper_bound())
    throw InvalidArgumentError(fmt::format("rank {}: send has tag {}: MPI allows 0..{}", rank_, tag,
                                           tag_upper_bound()));
  check_tensor(t, "send", "the tensor");
  const int bytes = check_count(t.nbytes(), "send");
  return start(MpiWork::Kind::kSend, "send",
               fmt::format("of {} bytes to rank {} (tag {})", t.nbytes(), dst, tag), o.timeout,
               [&](MpiWork& w) {
                 return MPI_Isend(t.data, bytes, MPI_BYTE, dst, tag, comm_, w.request());
               });
}

std::shared_ptr<Work> MpiProcessGroup::irecv(const TensorView& t, int src, int tag,
                                             const RecvOptions& o) {
  if (src < 0 || src >= size_ || src == rank_)
    throw InvalidArgumentError(fmt::format(
        "rank {}: recv names rank {}, but group {} has ranks 0..{} and a rank cannot receive from "
        "itself", rank_, src, name_, size_ - 1));
  if (tag < 0 || tag > tag_upper_bound())
    throw InvalidArgumentError(fmt::format("rank {}: recv has tag {}: MPI allows 0..{}", rank_, tag,
                                           tag_upper_bound()));
  check_tensor(t, "recv", "the tensor");
  const int bytes = check_count(t.nbytes(), "recv");
  const std::string desc = fmt::format("of {} bytes from rank {} (tag {})", t.nbytes(), src, tag);
  std::string what = fmt::format("rank {}: recv {} of group {} (mpi)", rank_, desc, name_);
  return start(MpiWork::Kind::kRecv, "recv", desc, o.timeout, [&](MpiWork& w) {
    w.on_success([bytes, what](const MPI_Status& status) {
      int got = 0;
      MPI_Get_count(&status, MPI_BYTE, &got);
      if (got != bytes)
        throw InvalidArgumentError(fmt::format(
            "{}: the sender sent {} bytes; sends and receives must have the same size", what, got));
    });
    return MPI_Irecv(t.data, bytes, MPI_BYTE, src, tag, comm_, w.request());
  });
}

// ---- collectives ----

std::shared_ptr<Work> MpiProcessGroup::broadcast(const TensorView& t, const BroadcastOptions& o) {
  check_tensor(t, "broadcast", "the tensor");
  check_root(o.root, "broadcast");
  check_algorithm(o.algorithm, "broadcast");
  const int bytes = check_count(t.nbytes(), "broadcast");
  return start(MpiWork::Kind::kCollective, "broadcast", describe(t), o.timeout, [&](MpiWork& w) {
    return MPI_Ibcast(t.data, bytes, MPI_BYTE, o.root, comm_, w.request());
  });
}

std::shared_ptr<Work> MpiProcessGroup::allreduce(const TensorView& t, const AllreduceOptions& o) {
  check_tensor(t, "all_reduce", "the tensor");
  check_algorithm(o.algorithm, "all_reduce");
  MPI_Datatype type = reduction_type(t.dtype, o.op, "all_reduce");
  const int count = check_count(t.numel, "all_reduce");
  const int n = size_;
  return start(MpiWork::Kind::kCollective, "all_reduce",
               describe(t) + " " + std::string(to_string(o.op)), o.timeout, [&](MpiWork& w) {
    if (o.op == ReduceOp::kAvg)
      w.on_success([t, n](const MPI_Status&) { scale_down(t.data, t.numel, t.dtype, n); });
    return MPI_Iallreduce(MPI_IN_PLACE, t.data, count, type, op_of(o.op), comm_, w.request());
  });
}

std::shared_ptr<Work> MpiProcessGroup::reduce(const TensorView& t, const ReduceOptions& o) {
  check_tensor(t, "reduce", "the tensor");
  check_root(o.root, "reduce");
  check_algorithm(o.algorithm, "reduce");
  MPI_Datatype type = reduction_type(t.dtype, o.op, "reduce");
  const int count = check_count(t.numel, "reduce");
  const int n = size_;
  const bool root = rank_ == o.root;
  return start(MpiWork::Kind::kCollective, "reduce",
               describe(t) + " " + std::string(to_string(o.op)), o.timeout, [&](MpiWork& w) {
    if (o.op == ReduceOp::kAvg && root)
      w.on_success([t, n](const MPI_Status&) { scale_down(t.data, t.numel, t.dtype, n); });
    return MPI_Ireduce(root ? MPI_IN_PLACE : t.data, root ? t.data : nullptr, count, type,
                       op_of(o.op), o.root, comm_, w.request());
  });
}

std::shared_ptr<Work> MpiProcessGroup::allgather(const TensorView& out, const TensorView& in,
                                                 const AllgatherOptions& o) {
  check_tensor(out, "all_gather", "the output");
  check_tensor(in, "all_gather", "the input");
  check_same_dtype(out, in, "all_gather");
  check_algorithm(o.algorithm, "all_gather");
  if (out.numel != in.numel * size_)
    throw InvalidArgumentError(fmt::format(
        "rank {}: all_gather: the output has {} elements; it needs size() x input = {} x {}",
        rank_, out.numel, size_, in.numel));
  const int bytes = check_count(in.nbytes(), "all_gather");
  check_count(out.nbytes(), "all_gather");
  // MPI forbids overlapping buffers except through MPI_IN_PLACE: the input at its own block.
  const bool in_place =
      bytes > 0 && in.data == static_cast<std::byte*>(out.data) + rank_ * in.nbytes();
  return start(MpiWork::Kind::kCollective, "all_gather", describe(in), o.timeout, [&](MpiWork& w) {
    return MPI_Iallgather(in_place ? MPI_IN_PLACE : in.data, bytes, MPI_BYTE, out.data, bytes,
                          MPI_BYTE, comm_, w.request());
  });
}

std::shared_ptr<Work> MpiProcessGroup::allgatherv(const TensorView& out, const TensorView& in,
                                                  const std::vector<size_t>& counts,
                                                  const AllgatherOptions& o) {
  check_tensor(out, "all_gather_v", "the output");
  check_tensor(in, "all_gather_v", "the input");
  check_same_dtype(out, in, "all_gather_v");
  check_algorithm(o.algorithm, "all_gather_v");
  if (counts.size() != static_cast<size_t>(size_))
    throw InvalidArgumentError(fmt::format(
        "rank {}: all_gather_v: counts has {} entries; it needs one per rank ({})", rank_,
        counts.size(), size_));
  size_t total = 0;
  for (size_t c : counts) total += c;
  if (in.numel != counts[rank_] || out.numel < total)
    throw InvalidArgumentError(fmt::format(
        "rank {}: all_gather_v: the input has {} elements (counts says {}) and the output {} "
        "(the counts add up to {})", rank_, in.numel, counts[rank_], out.numel, total));
  const size_t elem = element_size(in.dtype);
  check_count(total * elem, "all_gather_v");
  return start(MpiWork::Kind::kCollective, "all_gather_v",
               fmt::format("{} x {} in all", to_string(in.dtype), total), o.timeout,
               [&](MpiWork& w) {
    auto& bytes = w.keep(size_);
    auto& displs = w.keep(size_);
    int off = 0;
    for (int i = 0; i < size_; ++i) {
      bytes[i] = static_cast<int>(counts[i] * elem);
      displs[i] = off;
      off += bytes[i];
    }
    return MPI_Iallgatherv(in.data, bytes[rank_], MPI_BYTE, out.data, bytes.data(), displs.data(),
                           MPI_BYTE, comm_, w.request());
  });
}

std::shared_ptr<Work> MpiProcessGroup::gather(const TensorView& out, const TensorView& in,
                                              const GatherOptions& o) {
  check_tensor(in, "gather", "the input");
  check_root(o.root, "gather");
  const bool root = rank_ == o.root;
  if (root) {
    check_tensor(out, "gather", "the output");
    check_same_dtype(out, in, "gather");
    if (out.numel != in.numel * size_)
      throw InvalidArgumentError(fmt::format(
          "rank {}: gather: the output has {} elements; it needs size() x input = {} x {}", rank_,
          out.numel, size_, in.numel));
    check_count(out.nbytes(), "gather");
  }
  const int bytes = check_count(in.nbytes(), "gather");
  return start(MpiWork::Kind::kCollective, "gather", describe(in), o.timeout, [&](MpiWork& w) {
    return MPI_Igather(in.data, bytes, MPI_BYTE, root ? out.data : nullptr, bytes, MPI_BYTE,
                       o.root, comm_, w.request());
  });
}

std::shared_ptr<Work> MpiProcessGroup::scatter(const TensorView& out, const TensorView& in,
                                               const ScatterOptions& o) {
  check_tensor(out, "scatter", "the output");
  check_root(o.root, "scatter");
  const bool root = rank_ == o.root;
  if (root) {
    check_tensor(in, "scatter", "the input");
    check_same_dtype(out, in, "scatter");
    if (in.numel != out.numel * size_)
      throw InvalidArgumentError(fmt::format(
          "rank {}: scatter: the input has {} elements; it needs size() x output = {} x {}", rank_,
          in.numel, size_, out.numel));
    check_count(in.nbytes(), "scatter");
  }
  const int bytes = check_count(out.nbytes(), "scatter");
  return start(MpiWork::Kind::kCollective, "scatter", describe(out), o.timeout, [&](MpiWork& w) {
    return MPI_Iscatter(root ? in.data : nullptr, bytes, MPI_BYTE, out.data, bytes, MPI_BYTE,
                        o.root, comm_, w.request());
  });
}

std::shared_ptr<Work> MpiProcessGroup::reduce_scatter(const TensorView& out, const TensorView& in,
                                                      const ReduceScatterOptions& o) {
  check_tensor(out, "reduce_scatter", "the output");
  check_tensor(in, "reduce_scatter", "the input");
  check_same_dtype(out, in, "reduce_scatter");
  check_algorithm(o.algorithm, "reduce_scatter");
  MPI_Datatype type = reduction_type(in.dtype, o.op, "reduce_scatter");
  if (in.numel != out.numel * size_)
    throw InvalidArgumentError(fmt::format(
        "rank {}: reduce_scatter: the input has {} elements; it needs size() x output = {} x {}",
        rank_, in.numel, size_, out.numel));
  const int count = check_count(out.numel, "reduce_scatter");
  check_count(in.numel, "reduce_scatter");
  const int n = size_;
  return start(MpiWork::Kind::kCollective, "reduce_scatter",
               describe(out) + " " + std::string(to_string(o.op)), o.timeout, [&](MpiWork& w) {
    if (o.op == ReduceOp::kAvg)
      w.on_success([out, n](const MPI_Status&) { scale_down(out.data, out.numel, out.dtype, n); });
    return MPI_Ireduce_scatter_block(in.data, out.data, count, type, op_of(o.op), comm_,
                                     w.request());
  });
}

std::shared_ptr<Work> MpiProcessGroup::alltoall(const TensorView& out, const TensorView& in,
                                                const AlltoallOptions& o) {
  check_tensor(out, "all_to_all", "the output");
  check_tensor(in, "all_to_all", "the input");
  check_same_dtype(out, in, "all_to_all");
  if (in.numel != out.numel || in.numel % size_ != 0)
    throw InvalidArgumentError(fmt::format(
        "rank {}: all_to_all: input ({}) and output ({}) must have the same number of elements, "
        "divisible by the group size {}", rank_, in.numel, out.numel, size_));
  check_count(in.nbytes(), "all_to_all");
  const int block = static_cast<int>(in.nbytes() / size_);
  return start(MpiWork::Kind::kCollective, "all_to_all", describe(in), o.timeout, [&](MpiWork& w) {
    return MPI_Ialltoall(in.data, block, MPI_BYTE, out.data, block, MPI_BYTE, comm_, w.request());
  });
}

std::shared_ptr<Work> MpiProcessGroup::alltoallv(const TensorView& out,
                                                 const std::vector<size_t>& out_counts,
                                                 const TensorView& in,
                                                 const std::vector<size_t>& in_counts,
                                                 const AlltoallOptions& o) {
  check_tensor(out, "all_to_all_v", "the output");
  check_tensor(in, "all_to_all_v", "the input");
  check_same_dtype(out, in, "all_to_all_v");
  if (out_counts.size() != static_cast<size_t>(size_) || in_counts.size() != static_cast<size_t>(size_))
    throw InvalidArgumentError(fmt::format(
        "rank {}: all_to_all_v: output_counts has {} and input_counts {} entries; both need one "
        "per rank ({})", rank_, out_counts.size(), in_counts.size(), size_));
  size_t out_total = 0, in_total = 0;
  for (int i = 0; i < size_; ++i) {
    out_total += out_counts[i];
    in_total += in_counts[i];
  }
  if (out_total > out.numel || in_total > in.numel)
    throw InvalidArgumentError(fmt::format(
        "rank {}: all_to_all_v: the counts add up to {} output and {} input elements, but the "
        "tensors have {} and {}", rank_, out_total, in_total, out.numel, in.numel));
  const size_t elem = element_size(in.dtype);
  check_count(out_total * elem, "all_to_all_v");
  check_count(in_total * elem, "all_to_all_v");
  return start(MpiWork::Kind::kCollective, "all_to_all_v",
               fmt::format("{} x {} out, {} in", to_string(in.dtype), in_total, out_total),
               o.timeout, [&](MpiWork& w) {
    auto layout = [&](const std::vector<size_t>& counts, std::vector<int>& bytes,
                      std::vector<int>& displs) {
      int off = 0;
      for (int i = 0; i < size_; ++i) {
        bytes[i] = static_cast<int>(counts[i] * elem);
        displs[i] = off;
        off += bytes[i];
      }
    };
    auto& sb = w.keep(size_);
    auto& sd = w.keep(size_);
    auto& rb = w.keep(size_);
    auto& rd = w.keep(size_);
    layout(in_counts, sb, sd);
    layout(out_counts, rb, rd);
    return MPI_Ialltoallv(in.data, sb.data(), sd.data(), MPI_BYTE, out.data, rb.data(), rd.data(),
                          MPI_BYTE, comm_, w.request());
  });
}

std::shared_ptr<Work> MpiProcessGroup::barrier(const BarrierOptions& o) {
  check_algorithm(o.algorithm, "barrier");
  return start(MpiWork::Kind::kCollective, "barrier", "nothing", o.timeout,
               [&](MpiWork& w) { return MPI_Ibarrier(comm_, w.request()); });
}

std::shared_ptr<ProcessGroup> MpiProcessGroup::new_group(const std::vector<int>& ranks) {
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0 || r >= size_)
      throw InvalidArgumentError(fmt::format(
          "rank {}: new_group({}) names rank {}, but group {} has ranks 0..{}", rank_,
          fmt::join(ranks, ", "), r, name_, size_ - 1));
    if (!seen.insert(r).second)
      throw InvalidArgumentError(fmt::format("rank {}: new_group({}) names rank {} twice", rank_,
                                             fmt::join(ranks, ", "), r));
  }
  if (ranks.empty())
    throw InvalidArgumentError(fmt::format("rank {}: new_group needs at least one rank", rank_));
  uint32_t child;
  {
    std::lock_guard lock(mu_);
    child = ++children_;
  }
  // MPI_Comm_split blocks without a limit until every rank of the parent calls it. A bounded
  // non-blocking all-gather of the member lists first makes sure all of them have arrived (and
  // agree), so the split that follows returns at once.
  std::vector<uint64_t> hashes(size_);
  const uint64_t mine = fnv1a(ranks);
  auto check = start(MpiWork::Kind::kCollective, "new_group",
                     fmt::format("[{}]", fmt::join(ranks, ", ")), std::chrono::milliseconds(0),
                     [&](MpiWork& w) {
    return MPI_Iallgather(&mine, 1, MPI_UINT64_T, hashes.data(), 1, MPI_UINT64_T, comm_,
                          w.request());
  });
  check->wait();
  for (int r = 0; r < size_; ++r)
    if (hashes[r] != mine)
      throw InvalidArgumentError(fmt::format(
          "rank {}: new_group({}) of group {}: rank {} passed a different list of ranks; every "
          "rank must pass the same", rank_, fmt::join(ranks, ", "), name_, r));
  int index = MPI_UNDEFINED;
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] == rank_) index = static_cast<int>(i);
  MPI_Comm sub = MPI_COMM_NULL;
  int rc;
  {
    CallLock call;
    rc = MPI_Comm_split(comm_, index == MPI_UNDEFINED ? MPI_UNDEFINED : 0,
                        index == MPI_UNDEFINED ? 0 : index, &sub);
  }
  if (rc != MPI_SUCCESS)
    throw PeerFailureError(fmt::format("rank {}: new_group({}) of group {}: MPI_Comm_split failed: {}",
                                       rank_, fmt::join(ranks, ", "), name_, error_string(rc)));
  if (sub == MPI_COMM_NULL) return nullptr;
  return std::make_shared<MpiProcessGroup>(sub, fmt::format("{}.{}", name_, child), timeout_);
}

void MpiProcessGroup::abort(const std::string& reason) {
  DTRAIN_LOG_WARN("rank {}: group {} (mpi) aborted: {}", rank_, name_, reason);
  auto error = std::make_exception_ptr(
      AbortedError(fmt::format("rank {}: group {} (mpi) was aborted: {}", rank_, name_, reason)));
  std::vector<std::weak_ptr<MpiWork>> pending;
  {
    std::lock_guard lock(mu_);
    if (!failure_) failure_ = error;
    pending.swap(pending_);
  }
  // Receives are cancelled; sends and collectives cannot be in MPI and are abandoned.
  for (auto& w : pending)
    if (auto work = w.lock()) work->cancel(error);
}

namespace {

const bool kRegistered = register_backend(Backend{
    "mpi", false,
    [](std::shared_ptr<Store>, int rank, int size, const ProcessGroupOptions& options) {
      return std::make_shared<MpiProcessGroup>(rank, size, options);
    }});

}  // namespace

}  // namespace dtrain::backends::mpi
