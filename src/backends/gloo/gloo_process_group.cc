#include "backends/gloo/gloo_process_group.h"

#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include "backends/gloo/gloo_p2p_work.h"
#include "backends/gloo/gloo_store.h"
#include "comm/arguments.h"
#include "comm/backend_registry.h"
#include "common/env.h"
#include "common/error_message.h"
#include "common/log.h"
#include "common/reduce.h"
#include "dtrain/error.h"

namespace dtrain::backends {
namespace {

// Gloo's TCP transport writes with writev, which raises SIGPIPE when the peer has gone: its
// default action kills this process before the failed collective can name the peer (a race with
// the peer's close, seen in GlooBackend.PeerDeathFailsTheCollective). Ignored, the write fails
// with EPIPE and gloo reports it. A handler the program installed itself is left alone (Python
// ignores SIGPIPE already).
void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
      !(current.sa_flags & SA_SIGINFO))
    ::signal(SIGPIPE, SIG_IGN);
}

// Gloo slot prefix of point-to-point messages; gloo's collectives use 0x01..0x08.
constexpr uint8_t kP2pSlotPrefix = 0x7f;

using GlooFunc = void (*)(void*, const void*, const void*, size_t);

// The address gloo's device listens on and peers dial: explicit, DTRAIN_SOCKET_ADDR, the local
// end of the store connection (the interface that routes to the master), else loopback. The
// same choice as the native backend's.
std::string pick_address(const ProcessGroupOptions& options, Store& store) {
  if (!options.advertise_addr.empty()) return options.advertise_addr;
  if (auto v = env::raw(env::kSocketAddr)) return *v;
  Store* s = &store;
  while (auto* prefix = dynamic_cast<PrefixStore*>(s)) s = prefix->base().get();
  if (auto* tcp = dynamic_cast<TcpStore*>(s)) return tcp->local_ip();
  return "127.0.0.1";
}

std::string describe(const TensorView& t) {
  return fmt::format("{} x {} ({} bytes)", to_string(t.dtype), t.numel, t.nbytes());
}

// Calls f(T{}) with the gloo element type of a reducible dtype.
template <typename F>
void with_gloo_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      f(float{});
      return;
    case DType::kF64:
      f(double{});
      return;
    case DType::kF16:
      f(gloo::float16{});
      return;
    case DType::kI8:
      f(int8_t{});
      return;
    case DType::kU8:
      f(uint8_t{});
      return;
    case DType::kI16:
      f(int16_t{});
      return;
    case DType::kI32:
      f(int32_t{});
      return;
    case DType::kI64:
      f(int64_t{});
      return;
    case DType::kBF16:
      break;
  }
  throw InternalError(fmt::format("gloo backend: no gloo type for {}", to_string(dtype)));
}

template <typename T, typename Op>
void bitwise(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<T*>(c);
  auto* x = static_cast<const T*>(a);
  auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(Op{}(x[i], y[i]));
}

// Gloo's own kernels for sum, product, min and max (AVG sums, then divides); gloo has no
// bitwise ones, so those are here (integers only: check_reduce_op refuses them on floats).
template <typename T>
GlooFunc reduce_function(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return static_cast<GlooFunc>(&gloo::sum<T>);
    case ReduceOp::kProd:
      return static_cast<GlooFunc>(&gloo::product<T>);
    case ReduceOp::kMin:
      return static_cast<GlooFunc>(&gloo::min<T>);
    case ReduceOp::kMax:
      return static_cast<GlooFunc>(&gloo::max<T>);
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      if constexpr (std::is_integral_v<T>) {
        if (op == ReduceOp::kBand) return &bitwise<T, std::bit_and<>>;
        if (op == ReduceOp::kBor) return &bitwise<T, std::bit_or<>>;
        return &bitwise<T, std::bit_xor<>>;
      }
      break;
  }
  throw InternalError(fmt::format("gloo backend: no kernel for {}", to_string(op)));
}

// Rethrows the current exception as a dtrain error that starts with `what` and says how long
// it ran: gloo's timeouts become TimeoutError, its I/O errors PeerFailureError.
[[noreturn]] void rethrow_gloo(const std::string& what, const Deadline& deadline) {
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const gloo::IoException& e) {
    const std::string text(e.what());
    if (text.find("Timed out") != std::string::npos)
      throw TimeoutError(
          fmt::format("{} did not finish within {}: {}", what, deadline.describe(), text));
    throw PeerFailureError(fmt::format("{} failed after {}: {}", what, deadline.describe(), text));
  } catch (const gloo::EnforceNotMet& e) {
    throw InvalidArgumentError(fmt::format("{}: gloo refused the call: {}", what, e.what()));
  } catch (const std::exception& e) {
    throw PeerFailureError(
        fmt::format("{} failed after {}: {}", what, deadline.describe(), e.what()));
  }
}

}  // namespace

GlooProcessGroup::GlooProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                                   const ProcessGroupOptions& options)
    : store_(std::move(store)), rank_(rank), size_(size), name_(options.name) {
  comm::check_rank_and_size(rank, size);
  if (!store_) throw InvalidArgumentError("backend gloo needs a store; got null");
  timeout_ = options.timeout.count() > 0 ? options.timeout : env::get_seconds(env::kTimeout);
  connect_timeout_ = options.connect_timeout.count() > 0 ? options.connect_timeout
                                                         : env::get_seconds(env::kConnectTimeout);
  gloo::transport::tcp::attr attr;
  attr.hostname = pick_address(options, *store_);
  try {
    device_ = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw InvalidArgumentError(fmt::format(
        "rank {}: backend gloo cannot listen on {}: {} (set DTRAIN_SOCKET_ADDR to an address of "
        "this host)",
        rank_, attr.hostname, e.what()));
  }
  GlooStore gloo_store(std::make_shared<PrefixStore>("gloo/" + name_, store_));
  connect(gloo_store, connect_timeout_);
}

GlooProcessGroup::GlooProcessGroup(const GlooProcessGroup& parent, int rank, int size,
                                   std::string name)
    : store_(parent.store_),
      device_(parent.device_),
      rank_(rank),
      size_(size),
      name_(std::move(name)),
      timeout_(parent.timeout_),
      connect_timeout_(parent.connect_timeout_) {
  GlooStore gloo_store(std::make_shared<PrefixStore>("gloo/" + name_, store_));
  connect(gloo_store, connect_timeout_);
}

void GlooProcessGroup::connect(gloo::rendezvous::Store& store,
                               std::chrono::milliseconds connect_timeout) {
  ignore_sigpipe_unless_handled();
  const Deadline deadline = Deadline::after(connect_timeout);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
  context->setTimeout(connect_timeout);
  try {
    context->connectFullMesh(store, device_);
  } catch (...) {
    rethrow_gloo(fmt::format("rank {}: backend gloo connecting the {} ranks of group {} via {}",
                             rank_, size_, name_, device_->str()),
                 deadline);
  }
  context->setTimeout(timeout_);
  context_ = std::move(context);
  executor_ = std::make_shared<comm::Executor>(
      [this](std::exception_ptr e) { mark_failed(e); },
      comm::ExecutorOptions{
          .spin = std::chrono::microseconds(env::get_int(env::kSpinUs).value_or(50))});
  executor_->start();
  DTRAIN_LOG_DEBUG("rank {}: gloo group {} of {} ranks connected via {}", rank_, name_, size_,
                   device_->str());
}

GlooProcessGroup::~GlooProcessGroup() {
  auto error = std::make_exception_ptr(
      AbortedError(fmt::format("rank {}: group {} (gloo) was destroyed", rank_, name_)));
  std::vector<std::weak_ptr<GlooP2pWork>> p2p;
  {
    std::lock_guard lock(mu_);
    p2p = failure_.take_in_flight();
  }
  cancel_all(std::move(p2p), error);
  if (executor_) executor_->shutdown(error);  // joins a running collective (up to its deadline)
}

void GlooProcessGroup::mark_failed(std::exception_ptr error) {
  std::lock_guard lock(mu_);
  failure_.set(std::move(error));
}

// ---- validation ----

void GlooProcessGroup::check_algorithm(const std::string& algorithm, const char* op) const {
  if (!algorithm.empty())
    throw comm::unsupported(
        info(), op, fmt::format("algorithm '{}'", algorithm), "CPU tensors",
        fmt::format("gloo has one {} algorithm; leave the algorithm empty", op));
}

// Reductions need gloo's element type: bf16 has none in this gloo.
void GlooProcessGroup::check_reducible(DType dtype, ReduceOp op, const char* name) const {
  if (dtype == DType::kBF16)
    throw comm::unsupported(info(), name, fmt::format("{} of bf16", name), "CPU tensors",
                            "this gloo (0.5) has no bfloat16 type; use f32 or f16, or the native "
                            "backend");
  check_reduce_op(dtype, op);
}

// ---- point to point ----

std::shared_ptr<Work> GlooProcessGroup::isend(const TensorView& tensor, int dst, int tag,
                                              const SendOptions& options) {
  comm::check_peer(info(), dst, tensor, "send");
  if (tag < 0)
    throw InvalidArgumentError(
        fmt::format("rank {}: send has tag {}: gloo needs tags >= 0", rank_, tag));
  std::lock_guard lock(mu_);
  if (failure_.cause())
    throw failure_.cannot_start(
        fmt::format("rank {}: send to rank {} of group {}", rank_, dst, name_));
  auto work = std::make_shared<GlooP2pWork>(
      *context_, GlooP2pWork::Kind::kSend, tensor, dst,
      gloo::Slot::build(kP2pSlotPrefix, static_cast<uint32_t>(tag)),
      Deadline::after(limit(options.timeout)),
      fmt::format("rank {}: send of {} bytes to rank {} (tag {}) of group {} (gloo)", rank_,
                  tensor.nbytes(), dst, tag, name_));
  failure_.track(work);
  return work;
}

std::shared_ptr<Work> GlooProcessGroup::irecv(const TensorView& tensor, int src, int tag,
                                              const RecvOptions& options) {
  comm::check_peer(info(), src, tensor, "recv");
  if (tag < 0)
    throw InvalidArgumentError(
        fmt::format("rank {}: recv has tag {}: gloo needs tags >= 0", rank_, tag));
  std::lock_guard lock(mu_);
  if (failure_.cause())
    throw failure_.cannot_start(
        fmt::format("rank {}: recv from rank {} of group {}", rank_, src, name_));
  auto work = std::make_shared<GlooP2pWork>(
      *context_, GlooP2pWork::Kind::kRecv, tensor, src,
      gloo::Slot::build(kP2pSlotPrefix, static_cast<uint32_t>(tag)),
      Deadline::after(limit(options.timeout)),
      fmt::format("rank {}: recv of {} bytes from rank {} (tag {}) of group {} (gloo)", rank_,
                  tensor.nbytes(), src, tag, name_));
  failure_.track(work);
  return work;
}

// ---- collectives ----

std::shared_ptr<Work> GlooProcessGroup::submit(const char* op, std::string desc,
                                               std::chrono::milliseconds timeout, Body body) {
  uint32_t seq;
  bool failed;
  {
    std::lock_guard lock(mu_);
    seq = ++next_seq_;
    failed = failure_.cause() != nullptr;
  }
  const Deadline deadline = Deadline::after(limit(timeout));
  std::string what = fmt::format("rank {}: {} of {} as collective #{} of group {} (gloo)", rank_,
                                 op, desc, seq, name_);
  auto run = [this, seq, deadline, what, body = std::move(body)] {
    {
      std::lock_guard lock(mu_);
      if (failure_.cause()) throw failure_.cannot_start(what);
    }
    try {
      // Gloo measures its timeout from the call; what is left of ours is the most it gets.
      body(Slot{seq, std::max(deadline.remaining(), std::chrono::milliseconds(1))});
    } catch (...) {
      rethrow_gloo(what, deadline);
    }
  };
  auto work = std::make_shared<comm::CollectiveWork>(std::move(run), deadline, what, executor_);
  if (failed) {
    std::lock_guard lock(mu_);
    work->fail(std::make_exception_ptr(failure_.cannot_start(what)));
    return work;
  }
  executor_->submit(work);
  return work;
}

std::shared_ptr<Work> GlooProcessGroup::broadcast(const TensorView& t, const BroadcastOptions& o) {
  comm::check_tensor(info(), t, "broadcast", "the tensor");
  comm::check_root(info(), o.root, "broadcast");
  check_algorithm(o.algorithm, "broadcast");
  return submit("broadcast", describe(t), o.timeout, [this, t, root = o.root](const Slot& s) {
    if (t.nbytes() == 0) return;
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<uint8_t*>(t.data), t.nbytes());
    opts.setRoot(root);
    opts.setTag(s.tag);
    opts.setTimeout(s.timeout);
    gloo::broadcast(opts);
  });
}

std::shared_ptr<Work> GlooProcessGroup::allreduce(const TensorView& t, const AllreduceOptions& o) {
  comm::check_tensor(info(), t, "all_reduce", "the tensor");
  comm::check_wire(info(), t, o);
  check_reducible(t.dtype, o.op, "all_reduce");
  auto algorithm = gloo::AllreduceOptions::Algorithm::UNSPECIFIED;
  if (o.algorithm == "ring")
    algorithm = gloo::AllreduceOptions::Algorithm::RING;
  else if (o.algorithm == "bcube")
    algorithm = gloo::AllreduceOptions::Algorithm::BCUBE;
  else if (!o.algorithm.empty())
    throw comm::unsupported(info(), "all_reduce", fmt::format("algorithm '{}'", o.algorithm),
                            "CPU tensors", "gloo has ring and bcube");
  return submit("all_reduce", describe(t) + " " + std::string(to_string(o.op)), o.timeout,
                [this, t, op = o.op, algorithm](const Slot& s) {
                  if (t.numel == 0) return;
                  with_gloo_type(t.dtype, [&](auto type) {
                    using T = decltype(type);
                    gloo::AllreduceOptions opts(context_);
                    opts.setOutput(static_cast<T*>(t.data), t.numel);
                    opts.setReduceFunction(reduce_function<T>(op));
                    opts.setAlgorithm(algorithm);
                    opts.setTag(s.tag);
                    opts.setTimeout(s.timeout);
                    gloo::allreduce(opts);
                  });
                  if (op == ReduceOp::kAvg)
                    scale_down(t.data, t.numel, t.dtype, static_cast<size_t>(size_));
                });
}

std::shared_ptr<Work> GlooProcessGroup::reduce(const TensorView& t, const ReduceOptions& o) {
  comm::check_tensor(info(), t, "reduce", "the tensor");
  comm::check_root(info(), o.root, "reduce");
  check_reducible(t.dtype, o.op, "reduce");
  check_algorithm(o.algorithm, "reduce");
  return submit("reduce", describe(t) + " " + std::string(to_string(o.op)), o.timeout,
                [this, t, op = o.op, root = o.root](const Slot& s) {
                  if (t.numel == 0) return;
                  with_gloo_type(t.dtype, [&](auto type) {
                    using T = decltype(type);
                    gloo::ReduceOptions opts(context_);
                    opts.setOutput(static_cast<T*>(t.data), t.numel);
                    opts.setRoot(root);
                    opts.setReduceFunction(reduce_function<T>(op));
                    opts.setTag(s.tag);
                    opts.setTimeout(s.timeout);
                    gloo::reduce(opts);
                  });
                  if (op == ReduceOp::kAvg && rank_ == root)
                    scale_down(t.data, t.numel, t.dtype, static_cast<size_t>(size_));
                });
}

std::shared_ptr<Work> GlooProcessGroup::allgather(const TensorView& out, const TensorView& in,
                                                  const AllgatherOptions& o) {
  comm::check_allgather(info(), out, in);
  check_algorithm(o.algorithm, "all_gather");
  return submit("all_gather", describe(in), o.timeout, [this, out, in](const Slot& s) {
    if (in.nbytes() == 0) return;
    gloo::AllgatherOptions opts(context_);
    opts.setInput(static_cast<uint8_t*>(in.data), in.nbytes());
    opts.setOutput(static_cast<uint8_t*>(out.data), out.nbytes());
    opts.setTag(s.tag);
    opts.setTimeout(s.timeout);
    gloo::allgather(opts);
  });
}

std::shared_ptr<Work> GlooProcessGroup::allgatherv(const TensorView& out, const TensorView& in,
                                                   const std::vector<size_t>& counts,
                                                   const AllgatherOptions& o) {
  const size_t total = comm::check_allgatherv(info(), out, in, counts);
  check_algorithm(o.algorithm, "all_gather_v");
  const size_t elem = element_size(in.dtype);
  return submit("all_gather_v", fmt::format("{} x {} in all", to_string(in.dtype), total),
                o.timeout, [this, out, in, counts, total, elem](const Slot& s) {
                  if (total == 0) return;
                  std::vector<size_t> bytes(counts.size());
                  for (size_t i = 0; i < counts.size(); ++i) bytes[i] = counts[i] * elem;
                  gloo::AllgathervOptions opts(context_);
                  opts.setInput(static_cast<uint8_t*>(in.data), in.nbytes());
                  opts.setOutput(static_cast<uint8_t*>(out.data), bytes);
                  opts.setTag(s.tag);
                  opts.setTimeout(s.timeout);
                  gloo::allgatherv(opts);
                });
}

std::shared_ptr<Work> GlooProcessGroup::gather(const TensorView& out, const TensorView& in,
                                               const GatherOptions& o) {
  comm::check_gather(info(), out, in, o.root);
  return submit("gather", describe(in), o.timeout, [this, out, in, root = o.root](const Slot& s) {
    if (in.nbytes() == 0) return;
    gloo::GatherOptions opts(context_);
    opts.setInput(static_cast<uint8_t*>(in.data), in.nbytes());
    if (rank_ == root) opts.setOutput(static_cast<uint8_t*>(out.data), in.nbytes() * size_);
    opts.setRoot(root);
    opts.setTag(s.tag);
    opts.setTimeout(s.timeout);
    gloo::gather(opts);
  });
}

std::shared_ptr<Work> GlooProcessGroup::scatter(const TensorView& out, const TensorView& in,
                                                const ScatterOptions& o) {
  comm::check_scatter(info(), out, in, o.root);
  return submit("scatter", describe(out), o.timeout, [this, out, in, root = o.root](const Slot& s) {
    const size_t block = out.nbytes();
    if (block == 0) return;
    gloo::ScatterOptions opts(context_);
    if (rank_ == root) {
      std::vector<uint8_t*> blocks(size_);
      for (int i = 0; i < size_; ++i) blocks[i] = static_cast<uint8_t*>(in.data) + i * block;
      opts.setInputs(blocks, block);
    }
    opts.setOutput(static_cast<uint8_t*>(out.data), block);
    opts.setRoot(root);
    opts.setTag(s.tag);
    opts.setTimeout(s.timeout);
    gloo::scatter(opts);
  });
}

// This gloo's reduce-scatter (ReduceScatterHalvingDoubling) is an old-style algorithm object
// over bound buffers with the context's fixed timeout and no tag, so it cannot honour per-call
// timeouts or run beside other collectives: reduce-scatter here is gloo's all-reduce of a copy
// of the input, of which this rank keeps its block (size() times the traffic of a true one).
std::shared_ptr<Work> GlooProcessGroup::reduce_scatter(const TensorView& out, const TensorView& in,
                                                       const ReduceScatterOptions& o) {
  comm::check_reduce_scatter(info(), out, in);
  check_reducible(in.dtype, o.op, "reduce_scatter");
  check_algorithm(o.algorithm, "reduce_scatter");
  return submit("reduce_scatter", describe(out) + " " + std::string(to_string(o.op)), o.timeout,
                [this, out, in, op = o.op](const Slot& s) {
                  if (out.numel == 0) return;
                  std::vector<std::byte> copy(in.nbytes());
                  std::memcpy(copy.data(), in.data, in.nbytes());
                  with_gloo_type(in.dtype, [&](auto type) {
                    using T = decltype(type);
                    gloo::AllreduceOptions opts(context_);
                    opts.setOutput(reinterpret_cast<T*>(copy.data()), in.numel);
                    opts.setReduceFunction(reduce_function<T>(op));
                    opts.setTag(s.tag);
                    opts.setTimeout(s.timeout);
                    gloo::allreduce(opts);
                  });
                  std::memcpy(out.data, copy.data() + rank_ * out.nbytes(), out.nbytes());
                  if (op == ReduceOp::kAvg)
                    scale_down(out.data, out.numel, out.dtype, static_cast<size_t>(size_));
                });
}

std::shared_ptr<Work> GlooProcessGroup::alltoall(const TensorView& out, const TensorView& in,
                                                 const AlltoallOptions& o) {
  comm::check_alltoall(info(), out, in);
  return submit("all_to_all", describe(in), o.timeout, [this, out, in](const Slot& s) {
    if (in.nbytes() == 0) return;
    gloo::AlltoallOptions opts(context_);
    opts.setInput(static_cast<uint8_t*>(in.data), in.nbytes());
    opts.setOutput(static_cast<uint8_t*>(out.data), out.nbytes());
    opts.setTag(s.tag);
    opts.setTimeout(s.timeout);
    gloo::alltoall(opts);
  });
}

std::shared_ptr<Work> GlooProcessGroup::alltoallv(const TensorView& out,
                                                  const std::vector<size_t>& out_counts,
                                                  const TensorView& in,
                                                  const std::vector<size_t>& in_counts,
                                                  const AlltoallOptions& o) {
  const auto totals = comm::check_alltoallv(info(), out, out_counts, in, in_counts);
  const size_t elem = element_size(in.dtype);
  return submit("all_to_all_v", totals.describe(in.dtype), o.timeout,
                [this, out, in, out_counts, in_counts, elem](const Slot& s) {
                  std::vector<int64_t> out_bytes(size_), in_bytes(size_);
                  for (int i = 0; i < size_; ++i) {
                    out_bytes[i] = static_cast<int64_t>(out_counts[i] * elem);
                    in_bytes[i] = static_cast<int64_t>(in_counts[i] * elem);
                  }
                  // No rank knows the whole matrix of counts, so every rank calls gloo, even with
                  // nothing to move: skipping here could leave a peer waiting.
                  gloo::AlltoallvOptions opts(context_);
                  opts.setInput(static_cast<uint8_t*>(in.data), in_bytes);
                  opts.setOutput(static_cast<uint8_t*>(out.data), out_bytes);
                  opts.setTag(s.tag);
                  opts.setTimeout(s.timeout);
                  gloo::alltoallv(opts);
                });
}

std::shared_ptr<Work> GlooProcessGroup::barrier(const BarrierOptions& o) {
  check_algorithm(o.algorithm, "barrier");
  return submit("barrier", "nothing", o.timeout, [this](const Slot& s) {
    gloo::BarrierOptions opts(context_);
    opts.setTag(s.tag);
    opts.setTimeout(s.timeout);
    gloo::barrier(opts);
  });
}

std::shared_ptr<ProcessGroup> GlooProcessGroup::new_group(const std::vector<int>& ranks) {
  comm::check_new_group(info(), ranks);
  uint32_t child;
  {
    std::lock_guard lock(mu_);
    child = ++children_;
  }
  const int index = index_in(ranks, rank_);
  if (index < 0) return nullptr;
  // The name holds the call's ordinal, so every member meets under the same store prefix.
  return std::make_shared<GlooProcessGroup>(*this, index, static_cast<int>(ranks.size()),
                                            fmt::format("{}.{}", name_, child));
}

void GlooProcessGroup::abort(const std::string& reason) {
  // Queued collectives fail when they come up (the group has failed); a running one cannot be
  // interrupted in gloo and ends at its own deadline. Sends and receives are cancelled.
  abort_group(mu_, failure_, rank_, name_, "gloo", reason);
}

namespace {

const bool kRegistered = register_backend(Backend{
    "gloo", true,
    [](std::shared_ptr<Store> store, int rank, int size, const ProcessGroupOptions& options) {
      return std::make_shared<GlooProcessGroup>(std::move(store), rank, size, options);
    }});

}  // namespace

}  // namespace dtrain::backends
