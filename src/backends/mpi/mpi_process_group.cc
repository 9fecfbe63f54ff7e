#include "backends/mpi/mpi_process_group.h"

#include <climits>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/mpi/mpi_runtime.h"
#include "comm/arguments.h"
#include "comm/backend_registry.h"
#include "common/env.h"
#include "common/error_message.h"
#include "common/log.h"
#include "common/reduce.h"
#include "dtrain/error.h"

namespace dtrain::backends::mpi {
namespace {

std::string describe(const TensorView& t) {
  return fmt::format("{} x {} ({} bytes)", to_string(t.dtype), t.numel, t.nbytes());
}

uint64_t fnv1a(const std::vector<int>& ranks) {
  uint64_t h = 1469598103934665603ull;
  for (int r : ranks)
    for (int i = 0; i < 4; ++i)
      h = (h ^ ((static_cast<uint32_t>(r) >> (8 * i)) & 0xffu)) * 1099511628211ull;
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
        "with the mpi backend ranks come from mpirun (pass -1 or the same)",
        rank, size, world_rank, world_size));
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
    throw PeerFailureError(
        fmt::format("rank {}: backend mpi: MPI_Comm_idup failed: {}", rank_, error_string(rc)));
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
    pending = failure_.take_in_flight();
    stuck = failure_.cause() != nullptr;
  }
  auto error = std::make_exception_ptr(
      AbortedError(fmt::format("rank {}: group {} (mpi) was destroyed", rank_, name_)));
  cancel_all(std::move(pending), error);
  // A communicator with abandoned requests is left alone: freeing it could wait on them.
  if (!stuck && comm_ != MPI_COMM_NULL && !finalized()) {
    CallLock call;
    MPI_Comm_free(&comm_);
  }
}

void MpiProcessGroup::mark_failed(std::exception_ptr error) {
  std::lock_guard lock(mu_);
  failure_.set(std::move(error));
}

// ---- validation ----

void MpiProcessGroup::check_algorithm(const std::string& algorithm, const char* op) const {
  if (!algorithm.empty())
    throw comm::unsupported(info(), op, fmt::format("algorithm '{}'", algorithm), "CPU tensors",
                            "MPI chooses its own (OpenMPI: --mca coll_tuned_*); leave the "
                            "algorithm empty");
}

int MpiProcessGroup::check_count(size_t count, const char* op) const {
  if (count > static_cast<size_t>(INT_MAX))
    throw comm::unsupported(info(), op, fmt::format("{} of more than {} elements", op, INT_MAX),
                            "CPU tensors",
                            fmt::format("MPI counts are int; got {}: split the call", count));
  return static_cast<int>(count);
}

MPI_Datatype MpiProcessGroup::reduction_type(DType dtype, ReduceOp op, const char* name) const {
  auto type = datatype_of(dtype);
  if (!type)
    throw comm::unsupported(info(), name, fmt::format("{} of {}", name, to_string(dtype)),
                            "CPU tensors",
                            "MPI has no 16-bit floating-point type; use f32, or the gloo (f16) or "
                            "native backend");
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
  std::string what = kind == MpiWork::Kind::kCollective
                         ? fmt::format("rank {}: {} of {} as collective #{} of group {} (mpi)",
                                       rank_, op, desc, ++next_seq_, name_)
                         : fmt::format("rank {}: {} {} of group {} (mpi)", rank_, op, desc, name_);
  auto work = std::make_shared<MpiWork>(
      kind, what, Deadline::after(timeout.count() > 0 ? timeout : timeout_), std::move(on_stuck));
  if (failure_.cause()) {
    work->fail_start(std::make_exception_ptr(failure_.cannot_start(what)));
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
  failure_.track(work);
  return work;
}

// ---- point to point ----

std::shared_ptr<Work> MpiProcessGroup::isend(const TensorView& t, int dst, int tag,
                                             const SendOptions& o) {
  comm::check_peer(info(), dst, t, "send");
  if (tag < 0 || tag > tag_upper_bound())
    throw InvalidArgumentError(
        fmt::format("rank {}: send has tag {}: MPI allows 0..{}", rank_, tag, tag_upper_bound()));
  const int bytes = check_count(t.nbytes(), "send");
  return start(
      MpiWork::Kind::kSend, "send",
      fmt::format("of {} bytes to rank {} (tag {})", t.nbytes(), dst, tag), o.timeout,
      [&](MpiWork& w) { return MPI_Isend(t.data, bytes, MPI_BYTE, dst, tag, comm_, w.request()); });
}

std::shared_ptr<Work> MpiProcessGroup::irecv(const TensorView& t, int src, int tag,
                                             const RecvOptions& o) {
  comm::check_peer(info(), src, t, "recv");
  if (tag < 0 || tag > tag_upper_bound())
    throw InvalidArgumentError(
        fmt::format("rank {}: recv has tag {}: MPI allows 0..{}", rank_, tag, tag_upper_bound()));
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
  comm::check_tensor(info(), t, "broadcast", "the tensor");
  comm::check_root(info(), o.root, "broadcast");
  check_algorithm(o.algorithm, "broadcast");
  const int bytes = check_count(t.nbytes(), "broadcast");
  return start(MpiWork::Kind::kCollective, "broadcast", describe(t), o.timeout, [&](MpiWork& w) {
    return MPI_Ibcast(t.data, bytes, MPI_BYTE, o.root, comm_, w.request());
  });
}

std::shared_ptr<Work> MpiProcessGroup::allreduce(const TensorView& t, const AllreduceOptions& o) {
  comm::check_tensor(info(), t, "all_reduce", "the tensor");
  comm::check_wire(info(), t, o);
  check_algorithm(o.algorithm, "all_reduce");
  MPI_Datatype type = reduction_type(t.dtype, o.op, "all_reduce");
  const int count = check_count(t.numel, "all_reduce");
  const int n = size_;
  return start(
      MpiWork::Kind::kCollective, "all_reduce", describe(t) + " " + std::string(to_string(o.op)),
      o.timeout, [&](MpiWork& w) {
        if (o.op == ReduceOp::kAvg)
          w.on_success([t, n](const MPI_Status&) { scale_down(t.data, t.numel, t.dtype, n); });
        return MPI_Iallreduce(MPI_IN_PLACE, t.data, count, type, op_of(o.op), comm_, w.request());
      });
}

std::shared_ptr<Work> MpiProcessGroup::reduce(const TensorView& t, const ReduceOptions& o) {
  comm::check_tensor(info(), t, "reduce", "the tensor");
  comm::check_root(info(), o.root, "reduce");
  check_algorithm(o.algorithm, "reduce");
  MPI_Datatype type = reduction_type(t.dtype, o.op, "reduce");
  const int count = check_count(t.numel, "reduce");
  const int n = size_;
  const bool root = rank_ == o.root;
  return start(
      MpiWork::Kind::kCollective, "reduce", describe(t) + " " + std::string(to_string(o.op)),
      o.timeout, [&](MpiWork& w) {
        if (o.op == ReduceOp::kAvg && root)
          w.on_success([t, n](const MPI_Status&) { scale_down(t.data, t.numel, t.dtype, n); });
        return MPI_Ireduce(root ? MPI_IN_PLACE : t.data, root ? t.data : nullptr, count, type,
                           op_of(o.op), o.root, comm_, w.request());
      });
}

std::shared_ptr<Work> MpiProcessGroup::allgather(const TensorView& out, const TensorView& in,
                                                 const AllgatherOptions& o) {
  comm::check_allgather(info(), out, in);
  check_algorithm(o.algorithm, "all_gather");
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
  const size_t total = comm::check_allgatherv(info(), out, in, counts);
  check_algorithm(o.algorithm, "all_gather_v");
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
                 return MPI_Iallgatherv(in.data, bytes[rank_], MPI_BYTE, out.data, bytes.data(),
                                        displs.data(), MPI_BYTE, comm_, w.request());
               });
}

std::shared_ptr<Work> MpiProcessGroup::gather(const TensorView& out, const TensorView& in,
                                              const GatherOptions& o) {
  comm::check_gather(info(), out, in, o.root);
  const bool root = rank_ == o.root;
  if (root) check_count(out.nbytes(), "gather");
  const int bytes = check_count(in.nbytes(), "gather");
  return start(MpiWork::Kind::kCollective, "gather", describe(in), o.timeout, [&](MpiWork& w) {
    return MPI_Igather(in.data, bytes, MPI_BYTE, root ? out.data : nullptr, bytes, MPI_BYTE, o.root,
                       comm_, w.request());
  });
}

std::shared_ptr<Work> MpiProcessGroup::scatter(const TensorView& out, const TensorView& in,
                                               const ScatterOptions& o) {
  comm::check_scatter(info(), out, in, o.root);
  const bool root = rank_ == o.root;
  if (root) check_count(in.nbytes(), "scatter");
  const int bytes = check_count(out.nbytes(), "scatter");
  return start(MpiWork::Kind::kCollective, "scatter", describe(out), o.timeout, [&](MpiWork& w) {
    return MPI_Iscatter(root ? in.data : nullptr, bytes, MPI_BYTE, out.data, bytes, MPI_BYTE,
                        o.root, comm_, w.request());
  });
}

std::shared_ptr<Work> MpiProcessGroup::reduce_scatter(const TensorView& out, const TensorView& in,
                                                      const ReduceScatterOptions& o) {
  comm::check_reduce_scatter(info(), out, in);
  check_algorithm(o.algorithm, "reduce_scatter");
  MPI_Datatype type = reduction_type(in.dtype, o.op, "reduce_scatter");
  const int count = check_count(out.numel, "reduce_scatter");
  check_count(in.numel, "reduce_scatter");
  const int n = size_;
  return start(MpiWork::Kind::kCollective, "reduce_scatter",
               describe(out) + " " + std::string(to_string(o.op)), o.timeout, [&](MpiWork& w) {
                 if (o.op == ReduceOp::kAvg)
                   w.on_success([out, n](const MPI_Status&) {
                     scale_down(out.data, out.numel, out.dtype, n);
                   });
                 return MPI_Ireduce_scatter_block(in.data, out.data, count, type, op_of(o.op),
                                                  comm_, w.request());
               });
}

std::shared_ptr<Work> MpiProcessGroup::alltoall(const TensorView& out, const TensorView& in,
                                                const AlltoallOptions& o) {
  comm::check_alltoall(info(), out, in);
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
  const auto totals = comm::check_alltoallv(info(), out, out_counts, in, in_counts);
  const size_t elem = element_size(in.dtype);
  check_count(totals.out * elem, "all_to_all_v");
  check_count(totals.in * elem, "all_to_all_v");
  return start(MpiWork::Kind::kCollective, "all_to_all_v", totals.describe(in.dtype), o.timeout,
               [&](MpiWork& w) {
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
                 return MPI_Ialltoallv(in.data, sb.data(), sd.data(), MPI_BYTE, out.data, rb.data(),
                                       rd.data(), MPI_BYTE, comm_, w.request());
               });
}

std::shared_ptr<Work> MpiProcessGroup::barrier(const BarrierOptions& o) {
  check_algorithm(o.algorithm, "barrier");
  return start(MpiWork::Kind::kCollective, "barrier", "nothing", o.timeout,
               [&](MpiWork& w) { return MPI_Ibarrier(comm_, w.request()); });
}

std::shared_ptr<ProcessGroup> MpiProcessGroup::new_group(const std::vector<int>& ranks) {
  comm::check_new_group(info(), ranks);
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
  auto check =
      start(MpiWork::Kind::kCollective, "new_group", fmt::format("[{}]", fmt::join(ranks, ", ")),
            std::chrono::milliseconds(0), [&](MpiWork& w) {
              return MPI_Iallgather(&mine, 1, MPI_UINT64_T, hashes.data(), 1, MPI_UINT64_T, comm_,
                                    w.request());
            });
  check->wait();
  for (int r = 0; r < size_; ++r)
    if (hashes[r] != mine)
      throw InvalidArgumentError(fmt::format(
          "rank {}: new_group({}) of group {}: rank {} passed a different list of ranks; every "
          "rank must pass the same",
          rank_, fmt::join(ranks, ", "), name_, r));
  const int member = index_in(ranks, rank_);
  const int index = member < 0 ? MPI_UNDEFINED : member;
  MPI_Comm sub = MPI_COMM_NULL;
  int rc;
  {
    CallLock call;
    rc = MPI_Comm_split(comm_, index == MPI_UNDEFINED ? MPI_UNDEFINED : 0,
                        index == MPI_UNDEFINED ? 0 : index, &sub);
  }
  if (rc != MPI_SUCCESS)
    throw PeerFailureError(
        fmt::format("rank {}: new_group({}) of group {}: MPI_Comm_split failed: {}", rank_,
                    fmt::join(ranks, ", "), name_, error_string(rc)));
  if (sub == MPI_COMM_NULL) return nullptr;
  return std::make_shared<MpiProcessGroup>(sub, fmt::format("{}.{}", name_, child), timeout_);
}

void MpiProcessGroup::abort(const std::string& reason) {
  // Receives are cancelled; sends and collectives cannot be in MPI and are abandoned.
  abort_group(mu_, failure_, rank_, name_, "mpi", reason);
}

namespace {

const bool kRegistered = register_backend(
    Backend{"mpi", false,
            [](std::shared_ptr<Store>, int rank, int size, const ProcessGroupOptions& options) {
              return std::make_shared<MpiProcessGroup>(rank, size, options);
            }});

}  // namespace

}  // namespace dtrain::backends::mpi
