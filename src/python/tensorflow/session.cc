// Session: Horovod's TensorFlow API on dtrain's coordinator (see session.h).
#include "python/tensorflow/session.h"

#include <algorithm>
#include <mutex>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/error.h"
#include "dtrain/timeline.h"
#include "horovod/negotiated_calls.h"
#include "horovod/rows.h"

namespace dtrain::python::tensorflow {

namespace {

std::mutex current_mutex;
std::shared_ptr<Session> current_session;  // guarded by current_mutex

// The rows of dimension 0 and the elements in one row.
std::pair<int64_t, int64_t> rows_of(const std::vector<int64_t>& shape) {
  if (shape.empty()) return {1, 1};
  int64_t row = 1;
  for (size_t d = 1; d < shape.size(); ++d) row *= shape[d];
  return {shape[0], row};
}

Coordinator::CallRequest request_of(Call::Kind kind, const TensorView& t,
                                    const std::vector<int64_t>& shape, int64_t op_or_root) {
  const Call c = Call::of(kind, t.dtype, shape, op_or_root, "");
  Coordinator::CallRequest request;
  request.kind = static_cast<uint8_t>(kind);
  request.dtype = t.dtype;
  request.signature = c.signature();  // after dimension 0 for allgather and alltoall
  request.text = c.describe();
  return request;
}

}  // namespace

Session::Session(const std::shared_ptr<ProcessGroup>& world, SessionOptions options)
    : world_(world) {
  Timeline::get(world->rank());
  std::vector<int> all(static_cast<size_t>(world->size()));
  std::iota(all.begin(), all.end(), 0);
  CoordinatorOptions co;
  co.name = "Horovod API";
  co.cycle_time = options.cycle_time;
  co.fusion_threshold_bytes = options.fusion_threshold_bytes;
  co.stall_timeout = options.stall_timeout;
  co.average_over_all_ranks = true;  // Horovod's join: the joined ranks' zeros count
  coordinator_ = std::make_shared<Coordinator>(world->new_group(all), co);
}

Session::~Session() { close(); }

void Session::close() {
  std::shared_ptr<Coordinator> coordinator;
  {
    std::lock_guard lock(current_mutex);
    coordinator.swap(coordinator_);
  }
  if (coordinator != nullptr) coordinator->stop();
}

std::shared_ptr<Session> Session::current() {
  std::lock_guard lock(current_mutex);
  return current_session;
}

void Session::set_current(std::shared_ptr<Session> session) {
  std::lock_guard lock(current_mutex);
  current_session = std::move(session);
}

std::shared_ptr<Coordinator> Session::coordinator() const {
  std::lock_guard lock(current_mutex);
  if (coordinator_ == nullptr)
    throw InvalidArgumentError(fmt::format(
        "rank {}: dtrain.tensorflow was shut down (shutdown()); call init() again first", rank()));
  return coordinator_;
}

void Session::queue(const std::string& name, const Coordinator::CallRequest& request,
                    std::function<void(ProcessGroup&)> body, Done done) {
  coordinator()->submit_call(name, request, std::move(body))->on_done(std::move(done));
}

void Session::allreduce(const std::string& name, const TensorView& tensor,
                        const std::vector<int64_t>& shape, ReduceOp op, Done done) {
  coordinator()->submit(name, tensor, op, shape)->on_done(std::move(done));
}

void Session::broadcast(const std::string& name, const TensorView& tensor,
                        const std::vector<int64_t>& shape, int root, Done done) {
  if (root < 0 || root >= size())
    throw InvalidArgumentError(
        fmt::format("rank {}: broadcast '{}': root rank {} is not a rank of this job of {}", rank(),
                    name, root, size()));
  queue(
      name, request_of(Call::Kind::kBroadcast, tensor, shape, root),
      [tensor, root](ProcessGroup& group) {
        BroadcastOptions o;
        o.root = root;
        o.async_op = false;
        group.broadcast(tensor, o)->wait();
      },
      std::move(done));
}

void Session::allgather(const std::string& name, const TensorView& input,
                        const std::vector<int64_t>& shape, Allocate allocate, Done done) {
  const auto [rows, row] = rows_of(shape);
  queue(
      name, request_of(Call::Kind::kAllgather, input, shape, 0),
      [input, rows = rows, row = row, allocate = std::move(allocate)](ProcessGroup& group) {
        // The coordinator agreed on everything but the rows, which each rank tells first.
        const std::vector<int64_t> every = rows_of_every_rank(group, rows);
        const TensorView out = allocate(std::accumulate(every.begin(), every.end(), int64_t{0}));
        gather_rows(group, input, every, row, out);
      },
      std::move(done));
}

void Session::alltoall(const std::string& name, const TensorView& input,
                       const std::vector<int64_t>& shape, std::vector<int64_t> send,
                       Allocate allocate, std::shared_ptr<std::vector<int64_t>> received,
                       Done done) {
  const auto [rows, row] = rows_of(shape);
  const int n = size();
  if (send.empty()) {
    if (rows % n != 0)
      throw InvalidArgumentError(fmt::format(
          "rank {}: alltoall '{}': {} rows cannot be split equally over {} ranks; pass splits",
          rank(), name, rows, n));
    send.assign(static_cast<size_t>(n), rows / n);
  }
  if (static_cast<int>(send.size()) != n ||
      std::accumulate(send.begin(), send.end(), int64_t{0}) != rows ||
      std::any_of(send.begin(), send.end(), [](int64_t s) { return s < 0; }))
    throw InvalidArgumentError(fmt::format(
        "rank {}: alltoall '{}': splits [{}] must be {} non-negative row counts adding up to the "
        "tensor's {} rows",
        rank(), name, fmt::join(send, ", "), n, rows));
  queue(
      name, request_of(Call::Kind::kAlltoall, input, shape, 0),
      [input, send = std::move(send), row = row, allocate = std::move(allocate),
       received = std::move(received)](ProcessGroup& group) {
        *received = rows_to_receive(group, send);
        const TensorView out =
            allocate(std::accumulate(received->begin(), received->end(), int64_t{0}));
        exchange_rows(group, input, send, *received, row, out);
      },
      std::move(done));
}

void Session::reducescatter(const std::string& name, const TensorView& input,
                            const std::vector<int64_t>& shape, ReduceOp op, Allocate allocate,
                            Done done) {
  if (shape.empty())
    throw InvalidArgumentError(fmt::format(
        "rank {}: reducescatter '{}': a scalar has no dimension 0 to scatter; give a tensor of "
        "at least one dimension",
        rank(), name));
  const auto [rows, row] = rows_of(shape);
  queue(
      name, request_of(Call::Kind::kReducescatter, input, shape, static_cast<int64_t>(op)),
      [input, rows = rows, row = row, op, allocate = std::move(allocate)](ProcessGroup& group) {
        const int64_t mine = scattered_rows(rows, group.size())[static_cast<size_t>(group.rank())];
        reduce_scatter_rows(group, input, rows, row, op, allocate(mine));
      },
      std::move(done));
}

void Session::join(std::function<void(std::exception_ptr, int last_joined)> done) {
  auto handle = coordinator()->join();
  handle->on_done([handle, done = std::move(done)](std::exception_ptr error) {
    done(error, error ? -1 : handle->last_joined());
  });
}

}  // namespace dtrain::python::tensorflow
