// C10dWork: the c10d::Work that the dtrain backend hands torch for every operation.
//
// It holds the dtrain Works the operation was split into (or, for a coalesced group of
// operations, their C10dWorks), the tensors they read and write (alive until it ends), and what
// to do once they succeed (copy a staging buffer back into the caller's tensors, for example).
// Whoever sees it end first settles it: the thread in wait(), a poll of isCompleted(), or the
// group's FutureCompleter once a future was asked for (DDP's buckets, comm hooks). Errors arrive as
// torch's DistBackendError with dtrain's full text: rank, peer, operation, sequence number, elapsed
// time.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "dtrain/work.h"

namespace dtrain::python {

class FutureCompleter;

class C10dWork : public c10d::Work {
 public:
  // `completer`: the group's. `has_future`: a collective (point-to-point works have no future).
  // `sequence`: the group's count of collectives once this one was issued (0 for point to point).
  C10dWork(int rank, c10d::OpType type, const char* profiling_title,
           const std::shared_ptr<FutureCompleter>& completer, bool has_future, uint64_t sequence);
  // Let go of before it ended (an async_op whose work the script dropped): the backend still
  // reads and writes its tensors, so a new work takes over the dtrain Works, the tensors and the
  // copy back, and the group's completer settles it (as torch's NCCL backend keeps a work until
  // its watchdog sees it end).
  ~C10dWork() override;

  // Building it (before it is returned to torch; not thread-safe).
  void add(std::shared_ptr<dtrain::Work> work) { works_.push_back(std::move(work)); }
  void add(c10::intrusive_ptr<C10dWork> part) { parts_.push_back(std::move(part)); }
  void then(std::function<void()> on_success) { on_success_ = std::move(on_success); }
  void set_result(std::vector<at::Tensor> outputs) { outputs_ = std::move(outputs); }
  void keep_alive(at::Tensor t) { alive_.push_back(std::move(t)); }

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override { return outputs_; }
  // The sender of a receive from any source (torch's recv without src), once it completed.
  int sourceRank() const override;
  void synchronize() override {}
  // timeout 0 (c10d's kNoTimeout): the operation's own deadline, which always comes.
  bool wait(std::chrono::milliseconds timeout) override;
  // Point-to-point works have no future, as with gloo; collectives do.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  uint64_t getSequencenumber() const override { return sequence_; }

  // Waits for every dtrain Work, runs on_success, completes the future. Never throws; the
  // error is recorded. With a timeout, false when another thread is settling it and did not
  // finish in time.
  bool settle(std::optional<std::chrono::milliseconds> timeout);

 private:
  void complete_future();

  std::vector<std::shared_ptr<dtrain::Work>> works_;
  std::vector<c10::intrusive_ptr<C10dWork>> parts_;
  std::function<void()> on_success_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> alive_;
  // Weak: the completer's own thread may release the last reference to a work, which must not
  // then destroy (and join) that thread. Expired once the group is gone.
  std::weak_ptr<FutureCompleter> completer_;
  bool has_future_ = false;  // a collective: getFuture() is allowed
  uint64_t sequence_ = 0;

  std::timed_mutex settle_mu_;  // one thread settles; the others wait for it (bounded)
  std::mutex future_mu_;        // guards future_ and future_done_
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool future_done_ = false;
};

// The threads of a process group that settle the works whose future was asked for, in call
// order (the order the group runs its collectives), so that DDP's bucket futures and the
// callbacks chained on them run as soon as each all-reduce is done, while backward goes on.
//
// One thread, unless a callback blocks: a callback runs on the thread that completes its future,
// and some wait there for the future of another collective (PowerSGD's hook waits for its second
// all-reduce), which only a free thread can settle. So a work queued while no thread is free
// starts another (at most kMaxThreads), as gloo runs its callbacks on a pool of two.
class FutureCompleter {
 public:
  static constexpr int kMaxThreads = 8;
  FutureCompleter();
  // Stops the threads once the queue is empty (each work ends by its own deadline) and joins
  // them, with the GIL let go (their callbacks may need it). On one of its own threads (a
  // callback dropped the last reference to the group) it joins none: they finish on their own.
  ~FutureCompleter();
  void add(c10::intrusive_ptr<C10dWork> work);

  // Waits (up to `limit`) until every completer of the process has nothing queued and no thread
  // running a work. Called at Python's exit, before the interpreter finalizes: a thread that
  // then still ran a future's Python callback, or dropped the last reference to one, would be
  // ended by Python inside a destructor, which aborts the process.
  static void quiesce_all(std::chrono::milliseconds limit);

 private:
  struct Pool;  // the queue and the threads' state, which a thread left to finish keeps alive
  std::shared_ptr<Pool> pool_;
};

}  // namespace dtrain::python
