#include "backends/nccl/nccl_process_group.h"

#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/nccl/nccl_work.h"
#include "comm/backend_registry.h"
#include "common/env.h"
#include "common/error_message.h"
#include "common/log.h"
#include "common/reduce.h"
#include "dtrain/error.h"

namespace dtrain::backends::nccl {
namespace {

std::string describe(const TensorView& t) {
  return fmt::format("{} x {} ({} bytes)", to_string(t.dtype), t.numel, t.nbytes());
}

ncclDataType_t type_of(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI8:
      return ncclInt8;
    case DType::kU8:
      return ncclUint8;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kI16:
      break;  // NCCL has no 16-bit integer type
  }
  throw InvalidArgumentError(fmt::format(
      "nccl backend: NCCL has no type for {} tensors; convert them to int32 first, or use the "
      "native backend",
      to_string(dtype)));
}

// The same view, labelled CPU: for the shared size and dtype checks (comm/arguments.h), which
// refuse any other device. The device itself was checked by check_cuda.
TensorView as_checked(const TensorView& t) {
  TensorView v = t;
  v.device = Device::kCpu;
  return v;
}

std::byte* at(const TensorView& t, size_t offset) {
  return static_cast<std::byte*>(t.data) + offset;
}

bool overlap(const TensorView& a, const TensorView& b) {
  const auto* x = static_cast<const std::byte*>(a.data);
  const auto* y = static_cast<const std::byte*>(b.data);
  return a.nbytes() > 0 && b.nbytes() > 0 && x < y + b.nbytes() && y < x + a.nbytes();
}

// The first failure of a sequence of NCCL calls queued in one group.
void keep_first(ncclResult_t& first, ncclResult_t rc) {
  if (first == ncclSuccess && rc != ncclSuccess && rc != ncclInProgress) first = rc;
}

// ncclGroupStart, `calls` (which returns the first failure among them), ncclGroupEnd: NCCL
// runs the sends and receives of one group together, so no order among them can deadlock.
ncclResult_t grouped(const std::function<ncclResult_t()>& calls) {
  if (const ncclResult_t rc = ncclGroupStart(); rc != ncclSuccess) return rc;
  const ncclResult_t first = calls();
  const ncclResult_t end = ncclGroupEnd();
  return first != ncclSuccess ? first : end;
}

// A device-to-device copy on the group's stream (a rank's own block of gather, scatter,
// all_to_all); queued before the group's NCCL calls.
void copy_on(cudaStream_t stream, void* dst, const void* src, size_t bytes,
             const std::string& who) {
  if (bytes == 0 || dst == src) return;
  cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream),
              fmt::format("{}: copying this rank's own block of {} bytes", who, bytes));
}

// The GPU of this rank: LOCAL_RANK (set by `dtrain run` and torchrun) modulo the GPUs it sees,
// else the rank modulo them.
int pick_device(int rank, int count) {
  if (auto local = env::get_int(env::kLocalRank)) return static_cast<int>(*local % count);
  return rank % count;
}

}  // namespace

NcclProcessGroup::NcclProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                                   const ProcessGroupOptions& options)
    : base_store_(std::move(store)), rank_(rank), size_(size), name_(options.name) {
  comm::check_rank_and_size(rank, size);
  if (!base_store_) throw InvalidArgumentError("backend nccl needs a store; got null");
  timeout_ = options.timeout.count() > 0 ? options.timeout : env::get_seconds(env::kTimeout);
  connect_timeout_ = options.connect_timeout.count() > 0 ? options.connect_timeout
                                                         : env::get_seconds(env::kConnectTimeout);
  // Before any rendezvous: a rank without a GPU fails at once, not at the connect timeout.
  const cuda::DeviceCount gpus = cuda::device_count();
  if (gpus.count == 0)
    throw InvalidArgumentError(fmt::format(
        "rank {}: backend nccl needs a CUDA device: {}; run where a GPU and its driver are "
        "visible to this process (CUDA_VISIBLE_DEVICES), or use DTRAIN_BACKEND=native (it takes "
        "CUDA tensors through host memory) or gloo for CPU tensors",
        rank_, gpus.describe()));
  device_ = pick_device(rank_, gpus.count);
  store_ = std::make_shared<PrefixStore>("nccl/" + name_, base_store_);
  const Deadline deadline = Deadline::after(connect_timeout_);
  const std::string what =
      fmt::format("rank {}: backend nccl joining the {} ranks of group {} on cuda:{}", rank_, size_,
                  name_, device_);
  ncclUniqueId id;
  if (rank_ == 0) {
    cuda::DeviceGuard guard(device_);
    if (const ncclResult_t rc = ncclGetUniqueId(&id); rc != ncclSuccess)
      std::rethrow_exception(error_of(rc, what + ": ncclGetUniqueId"));
    const auto* b = reinterpret_cast<const uint8_t*>(&id);
    store_->set("unique_id", Bytes(b, b + sizeof(id)));
  } else {
    try {
      store_->wait({"unique_id"}, deadline.remaining());
    } catch (const TimeoutError& e) {
      throw TimeoutError(fmt::format(
          "{}: rank 0 did not publish the group's NCCL id within {}: is rank 0 alive, and does it "
          "see a GPU? ({})",
          what, deadline.describe(), e.what()));
    }
    const Bytes b = store_->get("unique_id");
    if (b.size() != sizeof(id))
      throw InvalidArgumentError(fmt::format(
          "{}: the store holds {} bytes under nccl/{}/unique_id, not an NCCL id of {}: another "
          "job or program uses this store and group name",
          what, b.size(), name_, sizeof(id)));
    std::memcpy(&id, b.data(), sizeof(id));
  }
  comm_ = NcclComm::join(id, rank_, size_, device_, name_, deadline, what);
  start();
}

NcclProcessGroup::NcclProcessGroup(const NcclProcessGroup& parent, std::shared_ptr<NcclComm> comm,
                                   int rank, int size, std::string name)
    : store_(std::make_shared<PrefixStore>("nccl/" + name, parent.base_store_)),
      base_store_(parent.base_store_),
      rank_(rank),
      size_(size),
      name_(std::move(name)),
      device_(parent.device_),
      timeout_(parent.timeout_),
      connect_timeout_(parent.connect_timeout_),
      comm_(std::move(comm)) {
  start();
}

void NcclProcessGroup::start() {
  cuda::DeviceGuard guard(device_);
  stream_ = std::make_unique<cuda::Stream>();
  order_ = std::make_unique<cuda::Event>();
  events_ = cuda::EventPool::create();
  one_ = std::make_unique<cuda::DeviceMemory>(sizeof(float));
  cuda::check(cudaMemset(one_->data(), 0, sizeof(float)), "cudaMemset of the barrier's element");
  p2p_ = std::make_shared<NcclP2p>(store_, rank_, device_, name_);
  int version = 0;
  ncclGetVersion(&version);
  DTRAIN_LOG_DEBUG("rank {}: nccl group {} of {} ranks on cuda:{} (NCCL {})", rank_, name_, size_,
                   device_, version);
}

NcclProcessGroup::~NcclProcessGroup() {
  auto error = std::make_exception_ptr(
      AbortedError(fmt::format("rank {}: group {} (nccl) was destroyed", rank_, name_)));
  // Queued sends and receives fail, their channels are aborted.
  if (p2p_) p2p_->abort(error);
  // An operation still on the stream may wait for a peer forever, and freeing the barrier's
  // element below waits for the GPU: abort the communicator first, which ends it. Otherwise the
  // communicator goes (aborted, idle) when the last Work holding it does.
  if (stream_ && comm_ && cudaStreamQuery(stream_->get()) == cudaErrorNotReady) comm_->abort(error);
}

// ---- validation ----

void NcclProcessGroup::check_cuda(const TensorView& t, const char* op, const char* which) const {
  if (t.device != Device::kCuda)
    throw comm::unsupported(info(), op, op, "CPU tensors",
                            "NCCL moves GPU memory only; use DTRAIN_BACKEND=native or gloo for "
                            "CPU tensors");
  if (t.device_index != device_)
    throw InvalidArgumentError(fmt::format(
        "rank {}: {}: {} is on cuda:{}, but this rank's NCCL communicator of group {} is on "
        "cuda:{} (LOCAL_RANK, else the rank, modulo the GPUs visible); pass tensors on cuda:{}",
        rank_, op, which, t.device_index, name_, device_, device_));
  cuda::check_device_tensor(t, fmt::format("rank {}: {}", rank_, op), which);
}

void NcclProcessGroup::check_algorithm(const std::string& algorithm, const char* op) const {
  if (!algorithm.empty())
    throw comm::unsupported(info(), op, fmt::format("algorithm '{}'", algorithm), "CUDA tensors",
                            "NCCL picks its own (set NCCL_ALGO to steer it); leave the algorithm "
                            "empty");
}

ncclRedOp_t NcclProcessGroup::reduce_op(DType dtype, ReduceOp op, const char* name) const {
  check_reduce_op(dtype, op);
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kProd:
      return ncclProd;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      break;
  }
  throw comm::unsupported(info(), name, fmt::format("{} with {}", name, to_string(op)),
                          "CUDA tensors",
                          "NCCL has no bitwise reductions; use the native backend (it takes CUDA "
                          "tensors through host memory), or all_gather and combine");
}

// ---- issuing ----

std::shared_ptr<Work> NcclProcessGroup::collective(const char* op, const std::string& desc,
                                                   std::initializer_list<void*> producers,
                                                   std::chrono::milliseconds timeout,
                                                   const Body& body) {
  p2p_->progress();  // sends and receives posted earlier get their turn too
  std::lock_guard lock(mu_);
  const uint32_t seq = ++next_seq_;
  const Deadline deadline = Deadline::after(limit(timeout));
  std::string what = fmt::format("rank {}: {} of {} as collective #{} of group {} (nccl, cuda:{})",
                                 rank_, op, desc, seq, name_, device_);
  if (auto failed = comm_->check_async(what))
    return NcclWork::failed(std::make_exception_ptr(PeerFailureError(fmt::format(
        "{} cannot start: the group is unusable since: {}", what, message_of(failed)))));
  try {
    cuda::DeviceGuard guard(device_);
    cudaStream_t stream = stream_->get();
    const void* ordered = stream;  // a producer named twice is waited for once
    for (void* producer : producers) {
      if (producer == ordered) continue;
      cuda::order_after(stream, producer, *order_, what);
      ordered = producer;
    }
    comm_->issue([&](ncclComm_t c) { return body(c, stream); }, deadline, what);
    auto done = events_->take();
    done->record(stream, what);
    return std::make_shared<NcclWork>(comm_, std::move(done), std::move(what), deadline);
  } catch (...) {
    return NcclWork::failed(std::current_exception());
  }
}

// ---- point to point ----

std::shared_ptr<Work> NcclProcessGroup::point_to_point(bool send, const TensorView& t, int peer,
                                                       int tag, std::chrono::milliseconds timeout) {
  const char* op = send ? "send" : "recv";
  check_cuda(t, op, "the tensor");
  comm::check_peer(info(), peer, as_checked(t), op);
  if (tag != 0)
    throw comm::unsupported(info(), op, fmt::format("{} with tag {}", op, tag), "CUDA tensors",
                            "NCCL has no tags: the messages between two ranks match in the order "
                            "they are posted; use tag 0");
  p2p_->progress();
  return p2p_->post(send, t, peer, Deadline::after(limit(timeout)),
                    fmt::format("rank {}: {} of {} bytes {} rank {} of group {} (nccl, cuda:{})",
                                rank_, op, t.nbytes(), send ? "to" : "from", peer, name_, device_));
}

std::shared_ptr<Work> NcclProcessGroup::isend(const TensorView& t, int dst, int tag,
                                              const SendOptions& o) {
  return point_to_point(true, t, dst, tag, o.timeout);
}

std::shared_ptr<Work> NcclProcessGroup::irecv(const TensorView& t, int src, int tag,
                                              const RecvOptions& o) {
  return point_to_point(false, t, src, tag, o.timeout);
}

// ---- collectives ----

std::shared_ptr<Work> NcclProcessGroup::broadcast(const TensorView& t, const BroadcastOptions& o) {
  check_cuda(t, "broadcast", "the tensor");
  comm::check_root(info(), o.root, "broadcast");
  check_algorithm(o.algorithm, "broadcast");
  return collective("broadcast", fmt::format("{} from rank {}", describe(t), o.root), {t.stream},
                    o.timeout, [t, root = o.root](ncclComm_t c, cudaStream_t s) {
                      if (t.nbytes() == 0) return ncclSuccess;
                      return ncclBroadcast(t.data, t.data, t.nbytes(), ncclUint8, root, c, s);
                    });
}

std::shared_ptr<Work> NcclProcessGroup::allreduce(const TensorView& t, const AllreduceOptions& o) {
  check_cuda(t, "all_reduce", "the tensor");
  comm::check_wire(info(), t, o);
  check_algorithm(o.algorithm, "all_reduce");
  const ncclRedOp_t op = reduce_op(t.dtype, o.op, "all_reduce");
  return collective("all_reduce", describe(t) + " " + std::string(to_string(o.op)), {t.stream},
                    o.timeout, [t, op](ncclComm_t c, cudaStream_t s) {
                      if (t.numel == 0) return ncclSuccess;
                      return ncclAllReduce(t.data, t.data, t.numel, type_of(t.dtype), op, c, s);
                    });
}

std::shared_ptr<Work> NcclProcessGroup::reduce(const TensorView& t, const ReduceOptions& o) {
  check_cuda(t, "reduce", "the tensor");
  comm::check_root(info(), o.root, "reduce");
  check_algorithm(o.algorithm, "reduce");
  const ncclRedOp_t op = reduce_op(t.dtype, o.op, "reduce");
  return collective("reduce", fmt::format("{} {} to rank {}", describe(t), to_string(o.op), o.root),
                    {t.stream}, o.timeout, [t, op, root = o.root](ncclComm_t c, cudaStream_t s) {
                      if (t.numel == 0) return ncclSuccess;
                      return ncclReduce(t.data, t.data, t.numel, type_of(t.dtype), op, root, c, s);
                    });
}

std::shared_ptr<Work> NcclProcessGroup::allgather(const TensorView& out, const TensorView& in,
                                                  const AllgatherOptions& o) {
  check_cuda(out, "all_gather", "the output");
  check_cuda(in, "all_gather", "the input");
  comm::check_allgather(info(), as_checked(out), as_checked(in));
  check_algorithm(o.algorithm, "all_gather");
  return collective("all_gather", describe(in), {in.stream, out.stream}, o.timeout,
                    [out, in](ncclComm_t c, cudaStream_t s) {
                      if (in.nbytes() == 0) return ncclSuccess;
                      return ncclAllGather(in.data, out.data, in.nbytes(), ncclUint8, c, s);
                    });
}

std::shared_ptr<Work> NcclProcessGroup::allgatherv(const TensorView& out, const TensorView& in,
                                                   const std::vector<size_t>& counts,
                                                   const AllgatherOptions& o) {
  check_cuda(out, "all_gather_v", "the output");
  check_cuda(in, "all_gather_v", "the input");
  const size_t total = comm::check_allgatherv(info(), as_checked(out), as_checked(in), counts);
  check_algorithm(o.algorithm, "all_gather_v");
  const size_t elem = element_size(in.dtype);
  const int me = rank_;
  // One broadcast per rank, of its block into its place in everyone's output, in one group.
  return collective("all_gather_v", fmt::format("{} x {} in all", to_string(in.dtype), total),
                    {in.stream, out.stream}, o.timeout,
                    [out, in, counts, elem, me](ncclComm_t c, cudaStream_t s) {
                      return grouped([&] {
                        ncclResult_t first = ncclSuccess;
                        size_t offset = 0;
                        for (size_t r = 0; r < counts.size(); ++r) {
                          const size_t bytes = counts[r] * elem;
                          if (bytes > 0) {
                            const void* send =
                                static_cast<int>(r) == me ? in.data : at(out, offset);
                            keep_first(first, ncclBroadcast(send, at(out, offset), bytes, ncclUint8,
                                                            static_cast<int>(r), c, s));
                          }
                          offset += bytes;
                        }
                        return first;
                      });
                    });
}

std::shared_ptr<Work> NcclProcessGroup::gather(const TensorView& out, const TensorView& in,
                                               const GatherOptions& o) {
  check_cuda(in, "gather", "the input");
  const bool root = rank_ == o.root;
  if (root) check_cuda(out, "gather", "the output");
  comm::check_gather(info(), as_checked(out), as_checked(in), o.root);
  if (root && overlap(out, in) && in.data != at(out, rank_ * in.nbytes()))
    throw InvalidArgumentError(fmt::format(
        "rank {}: gather: the input overlaps the root's output other than at its own block",
        rank_));
  const std::string who = fmt::format("rank {}: gather", rank_);
  return collective(
      "gather", fmt::format("{} to rank {}", describe(in), o.root),
      {in.stream, root ? out.stream : in.stream}, o.timeout,
      [this, out, in, root, r = o.root, who](ncclComm_t c, cudaStream_t s) {
        const size_t block = in.nbytes();
        if (block == 0) return ncclSuccess;
        if (!root) return grouped([&] { return ncclSend(in.data, block, ncclUint8, r, c, s); });
        copy_on(s, at(out, r * block), in.data, block, who);
        return grouped([&] {
          ncclResult_t first = ncclSuccess;
          for (int p = 0; p < size_; ++p)
            if (p != r) keep_first(first, ncclRecv(at(out, p * block), block, ncclUint8, p, c, s));
          return first;
        });
      });
}

std::shared_ptr<Work> NcclProcessGroup::scatter(const TensorView& out, const TensorView& in,
                                                const ScatterOptions& o) {
  check_cuda(out, "scatter", "the output");
  const bool root = rank_ == o.root;
  if (root) check_cuda(in, "scatter", "the input");
  comm::check_scatter(info(), as_checked(out), as_checked(in), o.root);
  const std::string who = fmt::format("rank {}: scatter", rank_);
  return collective(
      "scatter", fmt::format("{} from rank {}", describe(out), o.root),
      {out.stream, root ? in.stream : out.stream}, o.timeout,
      [this, out, in, root, r = o.root, who](ncclComm_t c, cudaStream_t s) {
        const size_t block = out.nbytes();
        if (block == 0) return ncclSuccess;
        if (!root) return grouped([&] { return ncclRecv(out.data, block, ncclUint8, r, c, s); });
        copy_on(s, out.data, at(in, r * block), block, who);
        return grouped([&] {
          ncclResult_t first = ncclSuccess;
          for (int p = 0; p < size_; ++p)
            if (p != r) keep_first(first, ncclSend(at(in, p * block), block, ncclUint8, p, c, s));
          return first;
        });
      });
}

std::shared_ptr<Work> NcclProcessGroup::reduce_scatter(const TensorView& out, const TensorView& in,
                                                       const ReduceScatterOptions& o) {
  check_cuda(out, "reduce_scatter", "the output");
  check_cuda(in, "reduce_scatter", "the input");
  comm::check_reduce_scatter(info(), as_checked(out), as_checked(in));
  check_algorithm(o.algorithm, "reduce_scatter");
  const ncclRedOp_t op = reduce_op(in.dtype, o.op, "reduce_scatter");
  return collective(
      "reduce_scatter", describe(out) + " " + std::string(to_string(o.op)), {in.stream, out.stream},
      o.timeout, [out, in, op](ncclComm_t c, cudaStream_t s) {
        if (out.numel == 0) return ncclSuccess;
        return ncclReduceScatter(in.data, out.data, out.numel, type_of(in.dtype), op, c, s);
      });
}

std::shared_ptr<Work> NcclProcessGroup::alltoall(const TensorView& out, const TensorView& in,
                                                 const AlltoallOptions& o) {
  check_cuda(out, "all_to_all", "the output");
  check_cuda(in, "all_to_all", "the input");
  comm::check_alltoall(info(), as_checked(out), as_checked(in));
  if (overlap(out, in))
    throw InvalidArgumentError(fmt::format(
        "rank {}: all_to_all: the input and the output overlap; NCCL sends and receives at once, "
        "so they must be separate buffers",
        rank_));
  const std::string who = fmt::format("rank {}: all_to_all", rank_);
  return collective("all_to_all", describe(in), {in.stream, out.stream}, o.timeout,
                    [this, out, in, who](ncclComm_t c, cudaStream_t s) {
                      const size_t block = in.nbytes() / static_cast<size_t>(size_);
                      if (block == 0) return ncclSuccess;
                      copy_on(s, at(out, rank_ * block), at(in, rank_ * block), block, who);
                      return grouped([&] {
                        ncclResult_t first = ncclSuccess;
                        for (int p = 0; p < size_; ++p) {
                          if (p == rank_) continue;
                          keep_first(first, ncclSend(at(in, p * block), block, ncclUint8, p, c, s));
                          keep_first(first,
                                     ncclRecv(at(out, p * block), block, ncclUint8, p, c, s));
                        }
                        return first;
                      });
                    });
}

std::shared_ptr<Work> NcclProcessGroup::alltoallv(const TensorView& out,
                                                  const std::vector<size_t>& out_counts,
                                                  const TensorView& in,
                                                  const std::vector<size_t>& in_counts,
                                                  const AlltoallOptions& o) {
  check_cuda(out, "all_to_all_v", "the output");
  check_cuda(in, "all_to_all_v", "the input");
  const auto totals =
      comm::check_alltoallv(info(), as_checked(out), out_counts, as_checked(in), in_counts);
  if (overlap(out, in))
    throw InvalidArgumentError(fmt::format(
        "rank {}: all_to_all_v: the input and the output overlap; NCCL sends and receives at "
        "once, so they must be separate buffers",
        rank_));
  const size_t elem = element_size(in.dtype);
  const std::string who = fmt::format("rank {}: all_to_all_v", rank_);
  return collective(
      "all_to_all_v", totals.describe(in.dtype), {in.stream, out.stream}, o.timeout,
      [this, out, in, out_counts, in_counts, elem, who](ncclComm_t c, cudaStream_t s) {
        std::vector<size_t> in_at(size_), out_at(size_);
        for (int p = 1; p < size_; ++p) {
          in_at[p] = in_at[p - 1] + in_counts[p - 1] * elem;
          out_at[p] = out_at[p - 1] + out_counts[p - 1] * elem;
        }
        copy_on(s, at(out, out_at[rank_]), at(in, in_at[rank_]), in_counts[rank_] * elem, who);
        // No rank knows the whole matrix of counts, so every rank calls NCCL, even with nothing to
        // move; empty messages are skipped on both ends alike.
        return grouped([&] {
          ncclResult_t first = ncclSuccess;
          for (int p = 0; p < size_; ++p) {
            if (p == rank_) continue;
            if (in_counts[p] > 0)
              keep_first(first,
                         ncclSend(at(in, in_at[p]), in_counts[p] * elem, ncclUint8, p, c, s));
            if (out_counts[p] > 0)
              keep_first(first,
                         ncclRecv(at(out, out_at[p]), out_counts[p] * elem, ncclUint8, p, c, s));
          }
          return first;
        });
      });
}

std::shared_ptr<Work> NcclProcessGroup::barrier(const BarrierOptions& o) {
  check_algorithm(o.algorithm, "barrier");
  void* one = one_->data();
  // No tensor names a stream: after the legacy default stream.
  return collective("barrier", "one f32 element", {nullptr}, o.timeout,
                    [one](ncclComm_t c, cudaStream_t s) {
                      return ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, c, s);
                    });
}

std::shared_ptr<ProcessGroup> NcclProcessGroup::new_group(const std::vector<int>& ranks) {
  comm::check_new_group(info(), ranks);
  uint32_t child;
  {
    std::lock_guard lock(mu_);
    child = ++children_;
  }
  const std::string list = fmt::format("{}", fmt::join(ranks, ", "));
  const std::string what =
      fmt::format("rank {}: new_group({}) of group {} (nccl)", rank_, list, name_);
  const Deadline deadline = Deadline::after(connect_timeout_);
  // ncclCommSplit is collective and cannot check that the ranks agree: compare with rank 0's
  // list first, so that a rank passing another list fails with a message, not a hang.
  const std::string key = fmt::format("new_group/{}", child);
  if (rank_ == 0) {
    store_->set(key, list);
  } else {
    store_->wait({key}, deadline.remaining());
    const std::string theirs = store_->get_string(key);
    if (theirs != list)
      throw InvalidArgumentError(fmt::format(
          "{}: rank 0 passed new_group({}); every rank of the group must pass the same list "
          "(the other ranks now wait in ncclCommSplit until their connect timeout)",
          what, theirs));
  }
  int index = -1;
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] == rank_) index = static_cast<int>(i);
  const std::string sub_name = fmt::format("{}.{}", name_, child);
  std::shared_ptr<NcclComm> sub;
  {
    p2p_->progress();
    std::lock_guard lock(mu_);  // in order with this group's collectives
    sub = comm_->split(index >= 0 ? 0 : NCCL_SPLIT_NOCOLOR, std::max(index, 0), sub_name, deadline,
                       what + ": ncclCommSplit");
  }
  if (index < 0) return nullptr;
  return std::make_shared<NcclProcessGroup>(*this, std::move(sub), index,
                                            static_cast<int>(ranks.size()), sub_name);
}

void NcclProcessGroup::abort(const std::string& reason) {
  DTRAIN_LOG_WARN("rank {}: group {} (nccl) aborted: {}", rank_, name_, reason);
  auto error = std::make_exception_ptr(
      AbortedError(fmt::format("rank {}: group {} (nccl) was aborted: {}", rank_, name_, reason)));
  comm_->abort(error);
  p2p_->abort(error);
}

namespace {

// Host tensors go through a native group beside it (ProcessGroup::create, per_device_group.h).
const bool kRegistered = register_backend(Backend{
    "nccl", true,
    [](std::shared_ptr<Store> store, int rank, int size, const ProcessGroupOptions& options) {
      return std::make_shared<NcclProcessGroup>(std::move(store), rank, size, options);
    },
    /*device_memory_only=*/true, /*version=*/NCCL_VERSION_CODE});

}  // namespace

}  // namespace dtrain::backends::nccl
