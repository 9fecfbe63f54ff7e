#include "python/torch/c10d_work.h"

#include <set>

#include <ATen/core/jit_type.h>
#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::python {

C10dWork::C10dWork(int rank, c10d::OpType type, const char* profiling_title,
                   const std::shared_ptr<FutureCompleter>& completer)
    : c10d::Work(rank, type, profiling_title),
      completer_(completer),
      has_future_(completer != nullptr) {}

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
  finish(error);
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
    throw TimeoutError(fmt::format(
        "rank {}: wait on {} timed out after {} ms (another thread is still waiting for it)", rank_,
        c10d::opTypeToString(opType_), timeout.count()));
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

namespace {
// Every live completer, for quiesce_all().
std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}
std::set<FutureCompleter*>& registry() {
  static std::set<FutureCompleter*> all;
  return all;
}
}  // namespace

FutureCompleter::FutureCompleter() {
  std::lock_guard l(registry_mu());
  registry().insert(this);
}

void FutureCompleter::quiesce_all(std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  std::lock_guard r(registry_mu());
  for (FutureCompleter* c : registry()) {
    std::unique_lock l(c->mu_);
    c->idle_cv_.wait_until(l, until, [&] { return c->quiet_locked(); });
  }
}

FutureCompleter::~FutureCompleter() {
  {
    std::lock_guard l(registry_mu());
    registry().erase(this);
  }
  std::vector<std::jthread> threads;
  {
    std::lock_guard l(mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) t.request_stop();
  cv_.notify_all();
  // The jthreads join here.
}

void FutureCompleter::add(c10::intrusive_ptr<C10dWork> work) {
  std::lock_guard l(mu_);
  queue_.push_back(std::move(work));
  if (idle_ > 0 || static_cast<int>(threads_.size()) >= kMaxThreads) {
    cv_.notify_one();
    return;
  }
  threads_.emplace_back([this](std::stop_token stop) { run(stop); });
}

void FutureCompleter::run(std::stop_token stop) {
  for (;;) {
    c10::intrusive_ptr<C10dWork> work;
    {
      std::unique_lock l(mu_);
      ++idle_;
      idle_cv_.notify_all();
      // Stops only once the queue is empty: a queued work always ends by its own deadline.
      cv_.wait(l, stop, [&] { return !queue_.empty(); });
      --idle_;
      if (queue_.empty()) return;
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work->settle(std::nullopt);  // runs the future's callbacks, which may block
    work.reset();  // before this thread counts as idle: the last reference may hold callbacks
  }
}

}  // namespace dtrain::python
