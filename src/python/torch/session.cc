// Session: the Horovod-compatible API's collectives on torch tensors (see session.h).
#include "python/torch/session.h"

#include <numeric>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/error.h"
#include "dtrain/timeline.h"
#include "dtrain/torch/tensor_view.h"
#include "horovod/rows.h"

namespace dtrain::python {

using dtrain::view_of;

namespace {

// Horovod's scaling: integers in double precision and truncated back, halves in float.
void scale(const at::Tensor& tensor, double factor) {
  if (factor == 1.0) return;
  if (!tensor.is_floating_point()) {
    tensor.copy_(tensor.to(at::kDouble).mul_(factor));
  } else if (tensor.element_size() < 4) {
    tensor.copy_(tensor.to(at::kFloat).mul_(factor));
  } else {
    tensor.mul_(factor);
  }
}

// The rows of dimension 0 and the number of elements in one row.
std::pair<int64_t, int64_t> rows_of(const at::Tensor& t) {
  if (t.dim() == 0) return {1, 1};
  int64_t row = 1;
  for (int64_t d = 1; d < t.dim(); ++d) row *= t.size(d);
  return {t.size(0), row};
}

// What this rank calls with `t`. A dtype dtrain cannot carry is left out (-1): the call's check
// refuses it then, and the other ranks fail with it instead of waiting.
Call call_of(Call::Kind kind, const at::Tensor& t, int64_t op_or_root, const std::string& name) {
  Call c = Call::of(kind, DType::kU8, t.sizes().vec(), op_or_root, name);
  try {
    c.dtype = static_cast<int64_t>(to_dtype(t.scalar_type()));
  } catch (const InvalidArgumentError&) {
    c.dtype = -1;
  }
  return c;
}

std::vector<int64_t> shape_with_rows(const at::Tensor& t, int64_t rows) {
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  if (shape.empty()) shape.push_back(1);
  shape[0] = rows;
  return shape;
}

}  // namespace

AsyncAllreduce::AsyncAllreduce(std::shared_ptr<Coordinator::Handle> handle, at::Tensor tensor,
                               double postscale, std::chrono::milliseconds limit)
    : handle_(std::move(handle)),
      tensor_(std::move(tensor)),
      postscale_(postscale),
      limit_(limit) {}

AsyncCall::AsyncCall(std::shared_ptr<Coordinator::Handle> handle, std::shared_ptr<Result> result,
                     std::chrono::milliseconds limit)
    : handle_(std::move(handle)), result_(std::move(result)), limit_(limit) {}

bool AsyncCall::wait_some(std::chrono::milliseconds slice) {
  if (handle_ == nullptr || handle_->wait_for(slice)) return true;
  if (std::chrono::steady_clock::now() - submitted_ > limit_)
    handle_->wait(std::chrono::milliseconds(0));  // throws the TimeoutError naming the call
  return false;
}

bool AsyncAllreduce::wait_some(std::chrono::milliseconds slice) {
  if (!handle_->wait_for(slice)) {
    if (std::chrono::steady_clock::now() - submitted_ > limit_)
      handle_->wait(std::chrono::milliseconds(0));  // throws the TimeoutError naming the tensor
    return false;
  }
  if (!finished_) {
    finished_ = true;
    if (tensor_.defined()) scale(tensor_, postscale_);
  }
  return true;
}

Session::Session(const std::shared_ptr<ProcessGroup>& world, SessionOptions options)
    : options_(options) {
  Timeline::get(world->rank());
  std::vector<int> all(static_cast<size_t>(world->size()));
  std::iota(all.begin(), all.end(), 0);
  ops_ = world->new_group(all);
  CoordinatorOptions co;
  co.name = "Horovod API";  // hvd.allreduce_async, hvd.DistributedOptimizer, ...
  co.cycle_time = options_.cycle_time;
  co.fusion_threshold_bytes = options_.fusion_threshold_bytes;
  co.stall_timeout = options_.stall_timeout;
  co.average_over_all_ranks = true;  // Horovod's join: the joined ranks' zeros count
  coordinator_ = std::make_shared<Coordinator>(world->new_group(all), co);
  calls_ = std::make_unique<NegotiatedCalls>(ops_);
}

Session::~Session() { close(); }

void Session::close() {
  calls_.reset();
  // Stopped here, on every rank at once: a DistributedOptimizer's hooks may hold it longer.
  if (coordinator_ != nullptr) coordinator_->stop();
  coordinator_.reset();
}

void Session::open() const {
  if (coordinator_ == nullptr)
    throw InvalidArgumentError(fmt::format(
        "rank {}: dtrain.torch was shut down (shutdown()); call init() again first", rank()));
}

std::chrono::milliseconds Session::wait_limit() const {
  return options_.stall_timeout + ops_->timeout();
}

void Session::run(const Call& call, const std::function<void()>& check,
                  const NegotiatedCalls::Body& body) {
  open();
  try {
    check();
  } catch (const InvalidArgumentError&) {
    calls_->refuse(call);  // the other ranks fail rather than wait for this one
    throw;
  }
  calls_->run(call, body);
}

std::shared_ptr<AsyncCall> Session::queue(const Call& call, const std::string& name,
                                          const std::function<void()>& check,
                                          std::function<void(ProcessGroup&)> body,
                                          std::shared_ptr<AsyncCall::Result> result) {
  open();
  check();  // the other ranks' calls of this name fail after the stall timeout, naming it
  Coordinator::CallRequest request;
  request.kind = static_cast<uint8_t>(call.kind);
  request.dtype = static_cast<DType>(call.dtype);
  request.signature = call.signature();
  request.text = call.describe();
  return std::make_shared<AsyncCall>(coordinator_->submit_call(name, request, std::move(body)),
                                     std::move(result), wait_limit());
}

void Session::allreduce_(const at::Tensor& tensor, ReduceOp op, double prescale, double postscale,
                         const std::string& name) {
  const Call c = call_of(Call::Kind::kAllreduce, tensor, static_cast<int64_t>(op), name);
  run(
      c, [&] { view_of(tensor); },
      [&](const NegotiatedCalls::Agreed&) {
        // Ranks that joined contribute zeros; an average divides by every rank, as Horovod's.
        scale(tensor, prescale);
        AllreduceOptions o;
        o.op = op;
        o.async_op = false;
        ops_->allreduce(view_of(tensor), o)->wait();
        scale(tensor, postscale);
      });
}

std::shared_ptr<AsyncCall> Session::broadcast_(const at::Tensor& tensor, int root,
                                               const std::string& name, bool async_op) {
  const Call c = call_of(Call::Kind::kBroadcast, tensor, root, name);
  auto check = [&] {
    view_of(tensor);
    if (root < 0 || root >= size())
      throw InvalidArgumentError(
          fmt::format("rank {}: broadcast: root rank {} is not a rank of this job of {}", rank(),
                      root, size()));
  };
  auto body = [tensor, root](ProcessGroup& group) {
    BroadcastOptions o;
    o.root = root;
    o.async_op = false;
    group.broadcast(view_of(tensor), o)->wait();
  };
  auto result = std::make_shared<AsyncCall::Result>();
  result->output = tensor;
  if (async_op) return queue(c, name, check, body, result);
  run(c, check, [&](const NegotiatedCalls::Agreed&) { body(*ops_); });
  return std::make_shared<AsyncCall>(nullptr, result, wait_limit());
}

namespace {

// Every rank's rows of `t` (rows[r] from rank r), concatenated along dimension 0.
at::Tensor gather_rows(ProcessGroup& group, const at::Tensor& t, const std::vector<int64_t>& rows) {
  at::Tensor out = at::empty(
      shape_with_rows(t, std::accumulate(rows.begin(), rows.end(), int64_t{0})), t.options());
  dtrain::gather_rows(group, view_of(t), rows, rows_of(t).second, view_of(out));
  return out;
}

// Sends send[j] rows of `t` to rank j; returns what arrived and the rows from each rank.
std::pair<at::Tensor, at::Tensor> exchange_rows(ProcessGroup& group, const at::Tensor& t,
                                                const std::vector<int64_t>& send) {
  const std::vector<int64_t> recv = rows_to_receive(group, send);
  at::Tensor out = at::empty(
      shape_with_rows(t, std::accumulate(recv.begin(), recv.end(), int64_t{0})), t.options());
  dtrain::exchange_rows(group, view_of(t), send, recv, rows_of(t).second, view_of(out));
  return {out, at::tensor(at::ArrayRef<int64_t>(recv)).to(at::kInt)};  // Horovod's are int32
}

}  // namespace

std::shared_ptr<AsyncCall> Session::allgather(const at::Tensor& tensor, const std::string& name,
                                              bool async_op) {
  const at::Tensor t = tensor.contiguous();
  const Call c = call_of(Call::Kind::kAllgather, t, 0, name);
  auto result = std::make_shared<AsyncCall::Result>();
  auto check = [&] { view_of(t); };
  if (async_op)
    return queue(
        c, name, check,
        [t, result](ProcessGroup& group) {
          // The coordinator agreed on everything but the rows, which each rank tells first.
          result->output = gather_rows(group, t, rows_of_every_rank(group, rows_of(t).first));
        },
        result);
  run(c, check, [&](const NegotiatedCalls::Agreed& agreed) {
    std::vector<int64_t> rows;
    for (const Call& theirs : agreed.calls) rows.push_back(theirs.rows());
    result->output = gather_rows(*ops_, t, rows);
  });
  return std::make_shared<AsyncCall>(nullptr, result, wait_limit());
}

std::shared_ptr<AsyncCall> Session::alltoall(const at::Tensor& tensor,
                                             const std::vector<int64_t>& splits,
                                             const std::string& name, bool async_op) {
  const at::Tensor t = tensor.contiguous();
  const Call c = call_of(Call::Kind::kAlltoall, t, 0, name);
  const int64_t rows = rows_of(t).first;
  const int n = size();
  std::vector<int64_t> send(splits);
  auto check = [&] {
    view_of(t);
    if (send.empty()) {
      if (rows % n != 0)
        throw InvalidArgumentError(fmt::format(
            "rank {}: alltoall: {} rows cannot be split equally over {} ranks; pass splits", rank(),
            rows, n));
      send.assign(static_cast<size_t>(n), rows / n);
    }
    if (static_cast<int>(send.size()) != n ||
        std::accumulate(send.begin(), send.end(), int64_t{0}) != rows ||
        std::any_of(send.begin(), send.end(), [](int64_t s) { return s < 0; }))
      throw InvalidArgumentError(fmt::format(
          "rank {}: alltoall: splits [{}] must be {} non-negative row counts adding up to the "
          "tensor's {} rows",
          rank(), fmt::join(send, ", "), n, rows));
  };
  auto result = std::make_shared<AsyncCall::Result>();
  if (async_op) {
    check();  // before the body takes the splits it fills in
    return queue(
        c, name, [] {},
        [t, send, result](ProcessGroup& group) {
          std::tie(result->output, result->received) = exchange_rows(group, t, send);
        },
        result);
  }
  run(c, check, [&](const NegotiatedCalls::Agreed&) {
    std::tie(result->output, result->received) = exchange_rows(*ops_, t, send);
  });
  return std::make_shared<AsyncCall>(nullptr, result, wait_limit());
}

void Session::barrier() {
  Call c;
  c.kind = Call::Kind::kBarrier;
  run(
      c, [] {},
      [this](const NegotiatedCalls::Agreed&) {
        BarrierOptions o;
        o.async_op = false;
        ops_->barrier(o)->wait();
      });
}

std::shared_ptr<AsyncAllreduce> Session::allreduce_async_(const at::Tensor& tensor,
                                                          const std::string& name, ReduceOp op,
                                                          double prescale, double postscale) {
  open();
  TensorView view = view_of(tensor);
  scale(tensor, prescale);  // and postscale by the first wait that sees it done
  return std::make_shared<AsyncAllreduce>(coordinator_->submit(name, view, op), tensor, postscale,
                                          wait_limit());
}

std::shared_ptr<AsyncAllreduce> Session::join() {
  open();
  // Bounded by the peers staying alive: the cycles fail when one dies.
  auto coordinated = std::make_shared<AsyncAllreduce>(coordinator_->join(), at::Tensor(), 1.0,
                                                      std::chrono::hours(24 * 365));
  calls_->join();
  return coordinated;
}

std::unique_ptr<GradientHooks> Session::gradient_hooks(
    std::vector<std::pair<std::string, at::Tensor>> named_parameters,
    GradientHooksOptions options) {
  open();
  options.wait_limit = wait_limit();
  return std::make_unique<GradientHooks>(coordinator_, std::move(named_parameters), options,
                                         rank());
}

}  // namespace dtrain::python
