#include "python/torch/c10d_work.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <set>

#include <ATen/core/jit_type.h>
#include <fmt/format.h>
#include <pybind11/pybind11.h>

#include "dtrain/error.h"

namespace dtrain::python {

namespace {

// torch's scripts catch torch.distributed.DistBackendError for a failed collective (torch turns
// c10::DistBackendError into it); the text stays dtrain's, whole.
std::exception_ptr as_backend_error(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error&) {
    return error;  // torch's own (DistBackendError, or an error of a copy back): as it is
  } catch (const std::exception& e) {
    return std::make_exception_ptr(
        c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, e.what()));
  } catch (...) {
    return error;
  }
}

}  // namespace

C10dWork::C10dWork(int rank, c10d::OpType type, const char* profiling_title,
                   const std::shared_ptr<FutureCompleter>& completer, bool has_future,
                   uint64_t sequence)
    : c10d::Work(rank, type, profiling_title),
      completer_(completer),
      has_future_(has_future),
      sequence_(sequence) {}

C10dWork::~C10dWork() {
  if (works_.empty() && parts_.empty()) return;
  {
    std::lock_guard l(mutex_);
    if (completed_) return;
  }
  c10::intrusive_ptr<C10dWork> heir;
  try {
    heir = c10::make_intrusive<C10dWork>(rank_, opType_, nullptr, nullptr, false, sequence_);
  } catch (...) {
    settle(std::nullopt);  // no memory for an heir: waited for here rather than left writing
    return;
  }
  heir->works_ = std::move(works_);
  heir->parts_ = std::move(parts_);
  heir->on_success_ = std::move(on_success_);
  heir->alive_ = std::move(alive_);
  heir->outputs_ = std::move(outputs_);
  try {
    if (auto completer = completer_.lock()) {
      completer->add(heir);
      return;
    }
  } catch (...) {
    // The completer could not take it (no thread could start): settled here instead.
  }
  heir->settle(std::nullopt);  // ends by the operations' own deadline
}

bool C10dWork::settle(std::optional<std::chrono::milliseconds> timeout) {
  std::unique_lock lock(settle_mu_, std::defer_lock);
  if (timeout) {
    if (!lock.try_lock_for(*timeout)) return false;
  } else {
    lock.lock();
  }
  {
    std::lock_guard l(mutex_);
    if (completed_) return true;
  }
  std::exception_ptr error;
  for (auto& part : parts_) {
    if (!part->settle(timeout)) return false;  // another thread is at it: not done yet
    if (auto e = part->exception(); e && !error) error = e;
  }
  for (auto& w : works_) {
    try {
      w->wait(timeout);
    } catch (...) {
      // The first error is the one to report; the other works are waited for all the same, so
      // that no buffer is left being written once this work says it ended.
      if (!error) error = std::current_exception();
    }
  }
  if (!error && on_success_) {
    try {
      on_success_();
    } catch (...) {
      error = std::current_exception();
    }
  }
  finish(error ? as_backend_error(error) : nullptr);
  alive_.clear();
  complete_future();
  return true;
}

bool C10dWork::isCompleted() {
  {
    std::lock_guard l(mutex_);
    if (completed_) return true;
  }
  for (auto& w : works_)
    if (!w->is_completed()) return false;
  for (auto& part : parts_)
    if (!part->isCompleted()) return false;
  // Every part is done: settle it here (copies back, if any) unless another thread is at it.
  return settle(std::chrono::milliseconds(0)) && c10d::Work::isCompleted();
}

bool C10dWork::isSuccess() const {
  std::lock_guard l(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr C10dWork::exception() const {
  std::lock_guard l(mutex_);
  return exception_;
}

int C10dWork::sourceRank() const {
  int source = works_.size() == 1 ? works_[0]->source_rank() : -1;
  if (source < 0)
    throw InvalidArgumentError(fmt::format(
        "dtrain backend: {} has no source rank (only a completed recv from any source has one)",
        c10d::opTypeToString(opType_)));
  return source;
}

bool C10dWork::wait(std::chrono::milliseconds timeout) {
  std::optional<std::chrono::milliseconds> limit;
  if (timeout > std::chrono::milliseconds(0)) limit = timeout;
  if (!settle(limit))
    C10_THROW_ERROR(DistBackendError,
                    fmt::format("rank {}: wait on {} timed out after {} ms (another thread is "
                                "still waiting for it)",
                                rank_, c10d::opTypeToString(opType_), timeout.count()));
  std::lock_guard l(mutex_);
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> C10dWork::getFuture() {
  if (!has_future_)
    throw InvalidArgumentError(fmt::format(
        "dtrain: {} has no future (as with gloo, only collectives do); call wait() instead",
        c10d::opTypeToString(opType_)));
  bool queue = false;
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard l(future_mu_);
    if (!future_) {
      future_ =
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
      queue = true;
    }
    future = future_;
  }
  if (queue) {
    bool done;
    {
      std::lock_guard l(mutex_);
      done = completed_;
    }
    auto completer = completer_.lock();
    if (done) {
      complete_future();
    } else if (completer) {
      completer->add(c10::intrusive_ptr<C10dWork>::reclaim_copy(this));
    } else {
      settle(std::nullopt);  // the group is gone: its completer too; ends by the deadline
    }
  }
  return future;
}

void C10dWork::complete_future() {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard l(future_mu_);
    if (!future_ || future_done_) return;
    {
      std::lock_guard l2(mutex_);
      if (!completed_) return;
    }
    future_done_ = true;
    future = future_;
  }
  std::exception_ptr error = exception();
  // Outside the locks: markCompleted runs the callbacks chained on the future (DDP's hooks).
  if (error)
    future->setError(error);
  else
    future->markCompleted(c10::IValue(outputs_));
}

struct FutureCompleter::Pool {
  Pool();
  ~Pool();
  void run(std::stop_token stop);
  bool quiet_locked() const { return queue_.empty() && idle_ == running_; }
  static std::mutex& registry_mu();
  static std::set<Pool*>& registry();

  std::mutex mu_;  // guards queue_, idle_, running_ and threads_
  std::condition_variable_any cv_;
  std::condition_variable_any idle_cv_;  // notified when a thread becomes idle or ends
  std::deque<c10::intrusive_ptr<C10dWork>> queue_;
  int idle_ = 0;     // threads waiting for a work
  int running_ = 0;  // threads started and not ended (joined or left to finish)
  // Each holds the pool (shared_ptr) until it ends; the completer moves them out when it goes.
  std::vector<std::jthread> threads_;
};

// Every live pool, for quiesce_all(): a pool lives on while a thread left to finish runs.
std::mutex& FutureCompleter::Pool::registry_mu() {
  static std::mutex mu;
  return mu;
}

std::set<FutureCompleter::Pool*>& FutureCompleter::Pool::registry() {
  static std::set<Pool*> all;
  return all;
}

FutureCompleter::Pool::Pool() {
  std::lock_guard l(registry_mu());
  registry().insert(this);
}

FutureCompleter::Pool::~Pool() {
  std::lock_guard l(registry_mu());
  registry().erase(this);
}

FutureCompleter::FutureCompleter() : pool_(std::make_shared<Pool>()) {}

void FutureCompleter::quiesce_all(std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  std::lock_guard r(Pool::registry_mu());
  for (Pool* p : Pool::registry()) {
    std::unique_lock l(p->mu_);
    p->idle_cv_.wait_until(l, until, [&] { return p->quiet_locked(); });
  }
}

FutureCompleter::~FutureCompleter() {
  std::vector<std::jthread> threads;
  {
    std::lock_guard l(pool_->mu_);
    threads.swap(pool_->threads_);
  }
  for (auto& t : threads) t.request_stop();
  pool_->cv_.notify_all();
  const bool own_thread = std::any_of(threads.begin(), threads.end(), [](const std::jthread& t) {
    return t.get_id() == std::this_thread::get_id();
  });
  if (own_thread) {
    // A thread cannot join itself, and the others may wait for what this one was doing: all
    // finish their queue on their own, each holding the pool.
    for (auto& t : threads) t.detach();
    return;
  }
  // A thread may still be in a future's Python callback, or dropping the last reference to one,
  // and need the GIL to finish; the group is often destroyed from Python (destroy_process_group,
  // or DDP's Reducer going away), with the GIL held. Joining with it held would wait forever.
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release release;
    threads.clear();
  }
  // Otherwise the jthreads join here.
}

void FutureCompleter::add(c10::intrusive_ptr<C10dWork> work) {
  Pool& p = *pool_;
  std::lock_guard l(p.mu_);
  p.queue_.push_back(std::move(work));
  if (p.idle_ > 0 || p.running_ >= kMaxThreads) {
    p.cv_.notify_one();
    return;
  }
  ++p.running_;
  p.threads_.emplace_back([pool = pool_](std::stop_token stop) { pool->run(stop); });
}

void FutureCompleter::Pool::run(std::stop_token stop) {
  for (;;) {
    c10::intrusive_ptr<C10dWork> work;
    {
      std::unique_lock l(mu_);
      ++idle_;
      idle_cv_.notify_all();
      // Stops only once the queue is empty: a queued work always ends by its own deadline.
      cv_.wait(l, stop, [&] { return !queue_.empty(); });
      --idle_;
      if (queue_.empty()) {
        --running_;
        idle_cv_.notify_all();
        return;
      }
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work->settle(std::nullopt);  // runs the future's callbacks, which may block
    work.reset();  // before this thread counts as idle: the last reference may hold callbacks
  }
}

}  // namespace dtrain::python
