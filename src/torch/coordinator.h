// Coordinator: Horovod's negotiation of which named tensors to all-reduce, in which order, and
// fused into which buffers. Internal to dtrain_torch (DistributedOptimizer owns one); free of
// LibTorch so that it compiles fast and can be tested alone.
//
// Every cycle (cycle_time) the background thread of every rank takes part in one allgather of a
// flag byte and one bit per cached tensor. Tensors whose bit is set on every rank run at once,
// in cache order. When some rank has a tensor not in the cache (or rank 0 has an error to
// report), a negotiation follows: every rank's new (name, dtype, count) requests reach rank 0,
// which answers with the tensors now ready on every rank, in the order they became ready there;
// the answer enters every rank's cache identically. Ready tensors are grouped by dtype and fused
// into buffers of up to fusion_threshold_bytes, one all-reduce each.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
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
  ReduceOp op = ReduceOp::kAvg;
  size_t fusion_threshold_bytes = size_t{64} << 20;
  std::chrono::microseconds cycle_time{1000};
  std::chrono::milliseconds stall_timeout{60000};
  size_t cache_capacity = 1024;
  std::chrono::milliseconds timeout{0};  // of each collective; 0 = the group's
};

class Coordinator {
 public:
  class Handle {
   public:
    // Waits until the tensor holds the reduction; throws the coordinator's error, or
    // TimeoutError naming the tensor after `timeout`.
    void wait(std::chrono::milliseconds timeout);
    bool done() const;

   private:
    friend class Coordinator;
    std::string name_;
    mutable std::mutex mutex_;  // guards done_ and error_
    std::condition_variable cv_;
    bool done_ = false;
    std::exception_ptr error_;
    void finish(std::exception_ptr error);
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
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Queues an in-place all-reduce of `tensor` under `name`; the buffer must stay valid until the
  // handle is done. Throws the coordinator's error once it failed.
  std::shared_ptr<Handle> submit(const std::string& name, const TensorView& tensor);
  // The error that stopped the coordinator (a tensor missing on some ranks, a collective that
  // failed), or null.
  std::exception_ptr error() const;
  Stats stats() const;

 private:
  struct Entry {
    std::string name;
    TensorView tensor;
    std::shared_ptr<Handle> handle;
    bool sent = false;  // request already sent to rank 0
  };
  struct Request {
    std::string name;
    DType dtype;
    uint64_t numel;
  };
  struct Pending {  // rank 0's table of tensors not yet ready everywhere
    Request request;
    std::vector<uint8_t> ranks;  // ranks that submitted it
    std::chrono::steady_clock::time_point since;
    std::string mismatch;
  };
  struct CacheEntry {
    std::string name;
    DType dtype;
    uint64_t numel;
  };

  void loop(std::stop_token stop);
  void cycle(bool stopping, bool& all_stopping);
  std::vector<std::string> negotiate(const std::vector<Request>& mine, std::string& error);
  std::string rank0_update(const std::vector<std::vector<Request>>& all,
                           std::vector<Request>& ready);
  std::string rank0_stall_error(const std::vector<std::vector<uint8_t>>& cached_bits);
  void execute(const std::vector<std::string>& names);
  void fail(std::exception_ptr error);

  std::shared_ptr<ProcessGroup> group_;
  CoordinatorOptions options_;

  mutable std::mutex mutex_;  // guards incoming_, inflight_, error_, stats_, stop_requested_
  std::vector<Entry> incoming_;
  std::unordered_set<std::string> inflight_;
  std::exception_ptr error_;
  Stats stats_;
  bool stop_requested_ = false;

  // Background thread only:
  std::vector<Entry> pending_;                       // submitted here, not yet reduced
  std::vector<CacheEntry> cache_;                    // index = cache id, same on every rank
  std::unordered_map<std::string, size_t> cache_id_;
  std::map<std::string, Pending> table_;             // rank 0
  std::vector<std::string> table_order_;             // rank 0: first-seen order
  std::map<size_t, std::chrono::steady_clock::time_point> partial_since_;  // rank 0, cache ids
  std::vector<std::byte> fusion_;
  std::string stall_error_;  // rank 0: to report at the next negotiation
  std::chrono::steady_clock::time_point stop_seen_{};

  std::jthread thread_;
};

}  // namespace dtrain
