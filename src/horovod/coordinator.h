// Coordinator: Horovod's negotiation of which named tensors to all-reduce, in which order, and
// fused into which buffers. Internal to dtrain_torch (DistributedOptimizer owns one, and so does
// the Python session of dtrain.torch); free of LibTorch so that it compiles fast and can be
// tested alone.
//
// Every cycle (cycle_time) the background thread of every rank takes part in one allgather of a
// flag byte and one bit per cached tensor. Tensors whose bit is set on every rank run at once,
// in cache order. When some rank has a tensor not in the cache (or rank 0 has an error to
// report), a negotiation follows: every rank's new (name, dtype, count) requests reach rank 0,
// which answers with the tensors now ready on every rank, in the order they became ready there;
// the answer enters every rank's cache identically. A tensor submitted with another dtype, size
// or op on some rank fails on every rank (its handle throws), and the coordinator goes on, as
// Horovod's does; a tensor missing on some ranks past stall_timeout stops it. Ready tensors are
// grouped by dtype and fused into buffers of up to fusion_threshold_bytes, one all-reduce each.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "dtrain/process_group.h"

namespace dtrain {

struct CoordinatorOptions {
  // Who reduces the tensors, as the errors say it: "DistributedOptimizer", "Horovod API".
  std::string name = "DistributedOptimizer";
  size_t fusion_threshold_bytes = size_t{64} << 20;
  std::chrono::microseconds cycle_time{1000};
  std::chrono::milliseconds stall_timeout{60000};
  size_t cache_capacity = 1024;
  std::chrono::milliseconds timeout{0};  // of each collective; 0 = the group's
  // With ranks joined, an average divides by the ranks that contributed (dtrain's C++
  // DistributedOptimizer), or by all of them, the joined ones' zeros included (Horovod's and
  // torch's Join default).
  bool average_over_all_ranks = false;
};

class Coordinator {
 public:
  class Handle {
   public:
    // Waits until the tensor holds the reduction; throws the coordinator's error, or
    // TimeoutError naming the tensor after `timeout`.
    void wait(std::chrono::milliseconds timeout);
    // Waits up to `timeout`; false if not done by then (nothing is cancelled), true once done.
    // Throws the coordinator's error.
    bool wait_for(std::chrono::milliseconds timeout);
    bool done() const;
    // For the handle of join(): the rank that joined last (every rank gets the same answer).
    int last_joined() const;
    // Calls `callback` once, with the error or null, when the handle is done (at once if it
    // is), on the thread that finishes it: usually the coordinator's, which it must not hold
    // long. For callers that cannot block a thread in wait(): TensorFlow's asynchronous kernels.
    void on_done(std::function<void(std::exception_ptr)> callback);

   private:
    friend class Coordinator;
    std::string name_;
    std::string owner_;         // CoordinatorOptions::name
    mutable std::mutex mutex_;  // guards done_ and error_
    std::condition_variable cv_;
    bool done_ = false;
    std::exception_ptr error_;
    int last_joined_ = -1;
    std::vector<std::function<void(std::exception_ptr)>> callbacks_;
    uint64_t flight_ = 0;  // the call's flight-recorder ticket
    void finish(std::exception_ptr error, int last_joined = -1);
  };

  struct Stats {
    uint64_t cycles = 0;
    uint64_t negotiations = 0;
    uint64_t cached_tensors = 0;  // tensors that ran without negotiation
    uint64_t collectives = 0;     // fused all-reduces issued
    uint64_t tensors = 0;         // tensors reduced
  };

  // Collective: every rank constructs one over the same group (give it a group of its own, as
  // its thread issues collectives concurrently with the caller's).
  Coordinator(std::shared_ptr<ProcessGroup> group, CoordinatorOptions options = {});
  // Collective: returns once every rank's coordinator is stopping (bounded by the group timeout).
  // Submissions fail afterwards. Whoever owns the coordinator's lifetime on every rank at the
  // same point (a session's close) calls it: other holders may let go of it at any time.
  void stop();
  ~Coordinator();  // stop()
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Queues an in-place all-reduce of `tensor` under `name`; the buffer must stay valid until the
  // handle is done. Every rank submits a name with the same dtype, element count and op, and the
  // same `shape` when one is given (a caller that knows it: Horovod refuses [17, 1311] beside
  // [17, 23, 57]). Throws the coordinator's error once it failed.
  std::shared_ptr<Handle> submit(const std::string& name, const TensorView& tensor,
                                 ReduceOp op = ReduceOp::kAvg,
                                 const std::vector<int64_t>& shape = {});
  // A collective other than an all-reduce (Horovod's asynchronous allgather, broadcast,
  // alltoall), matched across ranks by name like a tensor and run by `body` on the coordinator's
  // group once every rank submitted the name, in the same order on every rank. Never cached (it
  // is negotiated each time); with ranks joined it fails, as in Horovod.
  struct CallRequest {
    uint8_t kind = 1;  // the caller's code, not 0 (the all-reduce's)
    DType dtype = DType::kU8;
    uint64_t signature = 0;  // what every rank's call must share: shape, root, ...
    std::string text;        // how errors describe this rank's call: "allgather of f32 [17]"
  };
  std::shared_ptr<Handle> submit_call(const std::string& name, CallRequest request,
                                      std::function<void(ProcessGroup&)> body);
  // This rank has no more tensors to submit: it takes part in the others' reductions with zeros
  // until every rank has joined, then the handle is done (last_joined() says who came last).
  std::shared_ptr<Handle> join();
  // The error that stopped the coordinator (a tensor missing on some ranks, a collective that
  // failed), or null.
  std::exception_ptr error() const;
  Stats stats() const;

 private:
  struct Entry {
    std::string name;
    TensorView tensor;
    ReduceOp op;
    std::shared_ptr<Handle> handle;
    bool sent = false;                        // request already sent to rank 0
    CallRequest call;                         // kind 0: an all-reduce of `tensor`
    std::function<void(ProcessGroup&)> body;  // a call's collective
  };
  struct Request {  // also what every rank caches of a tensor once agreed
    std::string name;
    DType dtype;
    uint64_t numel;
    ReduceOp op;
    uint8_t kind = 0;  // 0: all-reduce; else a CallRequest's
    uint64_t signature = 0;
    std::string text;  // not compared: only for errors
    bool operator==(const Request& o) const {
      return name == o.name && dtype == o.dtype && numel == o.numel && op == o.op &&
             kind == o.kind && signature == o.signature;
    }
  };
  static Request request_of(const Entry& e);
  std::shared_ptr<Handle> enqueue(Entry entry);
  // A flight record of the named call (comm/flight_recorder.h); its ticket.
  uint64_t record(const std::string& name, uint8_t kind, DType dtype, uint64_t count, ReduceOp op);
  struct Pending {  // rank 0's table of tensors not yet ready everywhere
    Request request;
    int first_rank = 0;          // the rank whose request is `request`
    std::vector<uint8_t> ranks;  // ranks that submitted it
    std::chrono::steady_clock::time_point since;
    std::string mismatch;
  };

  struct Refusal {  // a tensor the ranks submitted differently: it fails on every rank alone
    std::string name;
    std::string why;
  };

  void loop(std::stop_token stop);
  void cycle(bool stopping, bool& all_stopping);
  std::vector<Request> negotiate(const std::vector<Request>& mine,
                                 const std::vector<uint8_t>& joined, std::string& error,
                                 std::vector<Refusal>& refused);
  void rank0_update(const std::vector<std::vector<Request>>& all,
                    const std::vector<uint8_t>& joined, std::vector<Request>& ready,
                    std::vector<Refusal>& refused);
  // Fails the handles of the refused tensors submitted here; the coordinator goes on.
  void refuse(const std::vector<Refusal>& refused);
  std::string rank0_stall_error(const std::vector<std::vector<uint8_t>>& cached_bits);
  // contributing: ranks that have not joined; joined: whether this rank has.
  void execute(const std::vector<Request>& tensors, int contributing, bool joined);
  void fail(std::exception_ptr error);

  std::shared_ptr<ProcessGroup> group_;
  uint16_t flight_group_ = 0;  // the flight recorder's name for options_.name
  CoordinatorOptions options_;

  mutable std::mutex mutex_;  // guards incoming_, inflight_, error_, stats_, stop_requested_,
                              // join_, joined_at_
  std::vector<Entry> incoming_;
  std::shared_ptr<Handle> join_;                     // set while this rank has joined
  std::chrono::system_clock::time_point joined_at_;  // when join_ was set
  std::unordered_set<std::string> inflight_;
  std::exception_ptr error_;
  Stats stats_;
  bool stop_requested_ = false;

  // Background thread only:
  std::vector<Entry> pending_;  // submitted here, not yet reduced
  std::vector<Request> cache_;  // index = cache id, same on every rank
  std::unordered_map<std::string, size_t> cache_id_;
  std::map<std::string, Pending> table_;  // rank 0
  std::vector<std::string> table_order_;  // rank 0: first-seen order
  std::map<size_t, std::chrono::steady_clock::time_point> partial_since_;  // rank 0, cache ids
  std::vector<std::byte> fusion_;
  std::string stall_error_;  // rank 0: to report at the next negotiation
  std::chrono::steady_clock::time_point stop_seen_{};
  std::vector<uint8_t> joined_before_;  // which ranks had joined at the previous cycle

  std::jthread thread_;
};

}  // namespace dtrain
