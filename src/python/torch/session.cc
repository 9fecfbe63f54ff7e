// Session: the Horovod-compatible API's collectives on torch tensors (see session.h).
#include "python/torch/session.h"

#include <numeric>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/error.h"
#include "dtrain/torch/tensor_view.h"
#include "dtrain/torch/timeline.h"

namespace dtrain::python {

using dtrain::view_of;

namespace {

// A scaling factor other than 1 needs a floating-point tensor.
void check_scale(const at::Tensor& tensor, double factor, const char* what) {
  if (factor != 1.0 && !tensor.is_floating_point())
    throw InvalidArgumentError(
        fmt::format("{} {} applies to floating-point tensors only; this one holds {}", what, factor,
                    c10::toString(tensor.scalar_type())));
}

void scale(const at::Tensor& tensor, double factor, const char* what) {
  check_scale(tensor, factor, what);
  if (factor != 1.0) tensor.mul_(factor);
}

// The rows of dimension 0 and the number of elements in one row.
std::pair<int64_t, int64_t> rows_of(const at::Tensor& t) {
  if (t.dim() == 0) return {1, 1};
  int64_t row = 1;
  for (int64_t d = 1; d < t.dim(); ++d) row *= t.size(d);
  return {t.size(0), row};
}

// Identifies the dtype and the dimensions after the first, which every rank must share.
int64_t row_signature(const at::Tensor& t) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(static_cast<uint64_t>(t.scalar_type()));
  mix(static_cast<uint64_t>(std::max<int64_t>(t.dim(), 1)));
  for (int64_t d = 1; d < t.dim(); ++d) mix(static_cast<uint64_t>(t.size(d)));
  return static_cast<int64_t>(h >> 1);
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

bool AsyncAllreduce::wait_some(std::chrono::milliseconds slice) {
  if (!handle_->wait_for(slice)) {
    if (std::chrono::steady_clock::now() - submitted_ > limit_)
      handle_->wait(std::chrono::milliseconds(0));  // throws the TimeoutError naming the tensor
    return false;
  }
  if (!finished_) {
    finished_ = true;
    if (tensor_.defined() && postscale_ != 1.0) tensor_.mul_(postscale_);
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
  coordinator_ = std::make_shared<Coordinator>(world->new_group(all), co);
}

Session::~Session() { close(); }

void Session::close() { coordinator_.reset(); }

void Session::open() const {
  if (coordinator_ == nullptr)
    throw InvalidArgumentError(fmt::format(
        "rank {}: dtrain.torch was shut down (shutdown()); call init() again first", rank()));
}

std::chrono::milliseconds Session::wait_limit() const {
  return options_.stall_timeout + ops_->timeout();
}

void Session::allreduce_(const at::Tensor& tensor, ReduceOp op, double prescale, double postscale) {
  TensorView view = view_of(tensor);
  scale(tensor, prescale, "prescale_factor");
  AllreduceOptions o;
  o.op = op;
  o.async_op = false;
  ops_->allreduce(view, o)->wait();
  scale(tensor, postscale, "postscale_factor");
}

void Session::broadcast_(const at::Tensor& tensor, int root) {
  BroadcastOptions o;
  o.root = root;
  o.async_op = false;
  ops_->broadcast(view_of(tensor), o)->wait();
}

at::Tensor Session::allgather(const at::Tensor& tensor) {
  const at::Tensor t = tensor.contiguous();
  const auto [rows, row] = rows_of(t);
  const int n = size();
  std::vector<int64_t> mine = {rows, row_signature(t)};
  std::vector<int64_t> all(2 * static_cast<size_t>(n));
  AllgatherOptions go;
  go.async_op = false;
  ops_->allgather(TensorView::of(all), TensorView::of(mine), go)->wait();
  std::vector<size_t> counts(static_cast<size_t>(n));
  int64_t total = 0;
  for (int r = 0; r < n; ++r) {
    if (all[2 * r + 1] != mine[1])
      throw InvalidArgumentError(fmt::format(
          "rank {}: allgather: rank {} passed a tensor whose dtype or dimensions after the first "
          "differ from this rank's {} of shape [{}]; only the first dimension may differ",
          rank(), r, c10::toString(t.scalar_type()), fmt::join(t.sizes(), ", ")));
    counts[r] = static_cast<size_t>(all[2 * r] * row);
    total += all[2 * r];
  }
  at::Tensor out = at::empty(shape_with_rows(t, total), t.options());
  ops_->allgatherv(view_of(out), view_of(t), counts, go)->wait();
  return out;
}

std::pair<at::Tensor, at::Tensor> Session::alltoall(const at::Tensor& tensor,
                                                    const std::vector<int64_t>& splits) {
  const at::Tensor t = tensor.contiguous();
  const auto [rows, row] = rows_of(t);
  const int n = size();
  std::vector<int64_t> send(splits);
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
  std::vector<int64_t> recv(static_cast<size_t>(n));
  AlltoallOptions ao;
  ao.async_op = false;
  ops_->alltoall(TensorView::of(recv), TensorView::of(send), ao)->wait();
  std::vector<size_t> send_counts(send.size()), recv_counts(recv.size());
  int64_t total = 0;
  for (int r = 0; r < n; ++r) {
    send_counts[r] = static_cast<size_t>(send[r] * row);
    recv_counts[r] = static_cast<size_t>(recv[r] * row);
    total += recv[r];
  }
  at::Tensor out = at::empty(shape_with_rows(t, total), t.options());
  ops_->alltoallv(view_of(out), recv_counts, view_of(t), send_counts, ao)->wait();
  return {out, at::tensor(at::ArrayRef<int64_t>(recv)).to(at::kInt)};  // Horovod's are int32
}

void Session::barrier() {
  BarrierOptions o;
  o.async_op = false;
  ops_->barrier(o)->wait();
}

std::shared_ptr<AsyncAllreduce> Session::allreduce_async_(const at::Tensor& tensor,
                                                          const std::string& name, ReduceOp op,
                                                          double prescale, double postscale) {
  open();
  TensorView view = view_of(tensor);
  check_scale(tensor, postscale,
              "postscale_factor");  // applied by the first wait that sees it done
  scale(tensor, prescale, "prescale_factor");
  return std::make_shared<AsyncAllreduce>(coordinator_->submit(name, view, op), tensor, postscale,
                                          wait_limit());
}

std::shared_ptr<AsyncAllreduce> Session::join() {
  open();
  return std::make_shared<AsyncAllreduce>(coordinator_->join(), at::Tensor(), 1.0,
                                          // bounded by the peers staying alive: the cycles fail
                                          // when one dies
                                          std::chrono::hours(24 * 365));
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
