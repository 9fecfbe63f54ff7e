// Session: what dtrain.tensorflow.init() sets up for Horovod's TensorFlow API: the job's world
// group and a Coordinator on a group of its own.
//
// Every collective of the API is a TensorFlow op with an asynchronous kernel. TensorFlow runs a
// graph's ready ops concurrently and in any order, so no call may block a thread waiting for the
// others: each goes to the coordinator under a name (the op's node name in a graph, or the one
// the caller gave), which matches the ranks' calls by name, fuses the all-reduces, runs every
// call in one order on every rank, and finishes the kernel from its callback. Calls that differ
// between ranks fail on every rank, and the session goes on.
//
// Free of TensorFlow and pybind11: src/python/tensorflow/ops.cc adapts TensorFlow's tensors,
// module.cc binds init and the queries.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/process_group.h"
#include "horovod/coordinator.h"

namespace dtrain::python::tensorflow {

// What the Python layer reads from DTRAIN_CYCLE_TIME_MS, DTRAIN_FUSION_THRESHOLD and
// DTRAIN_STALL_TIMEOUT; by default the coordinator's own defaults.
struct SessionOptions {
  std::chrono::microseconds cycle_time = CoordinatorOptions{}.cycle_time;
  size_t fusion_threshold_bytes = CoordinatorOptions{}.fusion_threshold_bytes;
  std::chrono::milliseconds stall_timeout = CoordinatorOptions{}.stall_timeout;
};

class Session {
 public:
  // Called once per call with its error, or null: on the coordinator's thread, or on the caller's
  // when the call is refused before it is queued.
  using Done = std::function<void(std::exception_ptr)>;
  // An output's buffer, allocated by the caller's framework once its rows are known.
  using Allocate = std::function<TensorView(int64_t rows)>;

  // Collective over `world`'s ranks.
  Session(const std::shared_ptr<ProcessGroup>& world, SessionOptions options);
  ~Session();  // close()
  // Collective: stops the coordinator on every rank; later calls fail saying so.
  void close();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // The session the ops use: the one init() opened, or null.
  static std::shared_ptr<Session> current();
  static void set_current(std::shared_ptr<Session> session);

  int rank() const { return world_->rank(); }
  int size() const { return world_->size(); }
  const std::shared_ptr<ProcessGroup>& world() const { return world_; }

  // In place: `tensor` (of `shape`) holds the reduction when `done` is called.
  void allreduce(const std::string& name, const TensorView& tensor,
                 const std::vector<int64_t>& shape, ReduceOp op, Done done);
  // In place from rank `root`.
  void broadcast(const std::string& name, const TensorView& tensor,
                 const std::vector<int64_t>& shape, int root, Done done);
  // Every rank's rows of `input` (of `shape`; the first dimension may differ between ranks),
  // concatenated along dimension 0 into the buffer `allocate` gives for the total.
  void allgather(const std::string& name, const TensorView& input,
                 const std::vector<int64_t>& shape, Allocate allocate, Done done);
  // send[j] rows of `input` to rank j (equal parts when `send` is empty); what arrives goes into
  // the buffer `allocate` gives, and `received` (sized by the caller to the ranks) tells how many
  // rows came from each rank.
  void alltoall(const std::string& name, const TensorView& input, const std::vector<int64_t>& shape,
                std::vector<int64_t> send, Allocate allocate,
                std::shared_ptr<std::vector<int64_t>> received, Done done);
  // Every rank's `input` (of `shape`, the same on every rank) reduced with `op`; this rank's
  // part of dimension 0 (equal parts, one more row for each of the first rows % size ranks)
  // into the buffer `allocate` gives.
  void reducescatter(const std::string& name, const TensorView& input,
                     const std::vector<int64_t>& shape, ReduceOp op, Allocate allocate, Done done);
  // This rank has no more data: it takes part in the others' all-reduces with zeros until every
  // rank has joined. `done` gets the rank that joined last.
  void join(std::function<void(std::exception_ptr, int last_joined)> done);

 private:
  std::shared_ptr<Coordinator> coordinator() const;  // throws once closed
  void queue(const std::string& name, const Coordinator::CallRequest& request,
             std::function<void(ProcessGroup&)> body, Done done);

  std::shared_ptr<ProcessGroup> world_;
  std::shared_ptr<Coordinator> coordinator_;
};

}  // namespace dtrain::python::tensorflow
