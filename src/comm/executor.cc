#include "comm/executor.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "comm/wait_time.h"
#include "dtrain/error.h"

namespace dtrain::comm {
namespace {

// Set while this thread runs a collective's body: a wait then is for an inner collective (the
// hierarchical forms'), whose own worker may need the core this thread would spin on.
thread_local bool in_collective = false;

}  // namespace

Executor::InCollective::InCollective() : outer(!in_collective) { in_collective = true; }

Executor::InCollective::~InCollective() {
  if (outer) in_collective = false;
}

std::string CollectiveWork::Label::describe() const {
  if (!text.empty()) return text;
  return fmt::format("rank {}: {} as collective #{} of group {}", rank, call.describe(), seq,
                     group);
}

void CollectiveWork::run() {
  // Failed before it started (a wait timed out behind an earlier collective, or the group
  // shut down): its caller may have reused the buffers already, so it must not touch them.
  if (completion_.done()) return;
  try {
    const Executor::InCollective scope;
    body_();
    completion_.succeed();
  } catch (...) {
    auto error = std::current_exception();
    if (auto ex = executor_.lock()) ex->on_failure_(error);
    completion_.fail(error);
  }
}

void CollectiveWork::wait_until_done(std::optional<std::chrono::milliseconds> timeout) {
  if (completion_.done()) {  // a synchronous call: nothing to wait for, no clock to read
    if (auto e = completion_.error()) std::rethrow_exception(e);
    return;
  }
  std::chrono::microseconds spin{0};
  if (auto ex = executor_.lock()) {
    ex->help(this);
    if (ex->options_.spin_inside_collectives || !in_collective) spin = ex->options_.spin;
  }
  // The worker is running it: a quick collective ends before a sleep would even begin.
  if (spin.count() > 0)
    for (auto spin_end = Clock::now() + spin; !completion_.done() && Clock::now() < spin_end;) {
    }
  // The collective enforces its own deadline on every message; the slack only covers the
  // time to notice and report it.
  const Deadline limit = timeout ? Deadline::after(*timeout)
                                 : Deadline::after(deadline_.remaining() + std::chrono::seconds(5));
  while (!completion_.done() && !limit.expired())
    completion_.wait_until(std::min(Clock::now() + std::chrono::seconds(1), limit.at()));
  if (!completion_.done()) {
    auto error = std::make_exception_ptr(TimeoutError(fmt::format(
        "{} did not finish within {}; the group is aborted, since the collective may still be "
        "writing into its buffers",
        what(), limit.describe())));
    if (auto ex = executor_.lock()) ex->on_failure_(error);
    completion_.wait_until(Clock::now() + std::chrono::seconds(5));
    completion_.fail(error);
  }
  if (auto e = completion_.error()) std::rethrow_exception(e);
}

Executor::Executor(std::function<void(std::exception_ptr)> on_failure, ExecutorOptions options)
    : on_failure_(std::move(on_failure)),
      options_(options),
      wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      timer_(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK)) {
  if (!wake_.valid() || !timer_.valid())
    throw InternalError(
        fmt::format("cannot create the executor's eventfd or timerfd: {}", std::strerror(errno)));
}

void Executor::wake_worker() {
  uint64_t one = 1;
  // Fails only when the counter is full, and then the worker is awake anyway.
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
}

void Executor::arm_timer_locked(Clock::time_point when) {
  // steady_clock is CLOCK_MONOTONIC on Linux; a zero time would disarm, so at least 1 ns.
  const int64_t ns = std::max<int64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(when.time_since_epoch()).count(), 1);
  itimerspec t{};
  t.it_value.tv_sec = ns / 1'000'000'000;
  t.it_value.tv_nsec = ns % 1'000'000'000;
  ::timerfd_settime(timer_.get(), TFD_TIMER_ABSTIME, &t, nullptr);
  timer_set_ = true;
}

void Executor::start() {
  thread_ = std::jthread([this](std::stop_token st) { worker(st); });
}

Executor::~Executor() {
  shutdown(std::make_exception_ptr(AbortedError("the process group was destroyed")));
}

void Executor::submit(std::shared_ptr<CollectiveWork> work, std::chrono::microseconds grace) {
  if (grace.count() <= 0) {
    {
      std::lock_guard lock(queue_mu_);
      queue_.push_back({std::move(work), Clock::time_point{}});
      queued_.store(queue_.size(), std::memory_order_release);
    }
    wake_worker();
    return;
  }
  std::lock_guard lock(queue_mu_);
  const Clock::time_point due = Clock::now() + grace;
  queue_.push_back({std::move(work), due});
  queued_.store(queue_.size(), std::memory_order_release);
  if (!timer_set_) arm_timer_locked(due);
}

void Executor::run_here(std::shared_ptr<CollectiveWork> work) {
  {
    // Nothing queued and nobody running the queue: this one is next, run without queueing it
    // (a collective queued meanwhile waits for run_mu_, behind it).
    std::unique_lock run(run_mu_, std::try_to_lock);
    if (run.owns_lock()) {
      if (queue_empty()) {
        work->run();
        return;
      }
    }
  }
  {
    std::lock_guard lock(queue_mu_);
    queue_.push_back({work, Clock::time_point{}});
    queued_.store(queue_.size(), std::memory_order_release);
  }
  help(work.get());
  if (work->is_completed()) return;
  // The worker holds the queue (an earlier asynchronous collective runs): it runs this one
  // next, in order. The wake-up covers the moment it was between its last one and its sleep.
  // Waiting here keeps the promise of a finished Work; its error stays in it for wait().
  wake_worker();
  try {
    work->wait(std::nullopt);
  } catch (...) {
  }
}

bool Executor::run_next() {
  std::shared_ptr<CollectiveWork> work;
  {
    std::lock_guard lock(queue_mu_);
    if (queue_.empty()) return false;
    work = std::move(queue_.front().work);
    queue_.pop_front();
    queued_.store(queue_.size(), std::memory_order_release);
  }
  work->run();
  return true;
}

void Executor::help(const CollectiveWork* work) {
  for (;;) {
    {
      std::lock_guard lock(queue_mu_);
      bool queued = false;
      for (const auto& q : queue_) queued |= q.work.get() == work;
      if (!queued) return;
    }
    std::unique_lock run(run_mu_, std::try_to_lock);
    if (!run.owns_lock()) return;  // the worker is running the queue
    run_next();
  }
}

void Executor::worker(std::stop_token stop) {
  // Collectives run here while the caller computes: waiting for them is not its step's
  // communication (the caller's own wait on the result is).
  comm::exclude_thread_from_wait_time();
  while (!stop.stop_requested()) {
    pollfd fds[2] = {{wake_.get(), POLLIN, 0}, {timer_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) {
      // Cannot happen with two valid descriptors; never spin on it.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    uint64_t drained;
    [[maybe_unused]] ssize_t n = ::read(wake_.get(), &drained, sizeof(drained));
    n = ::read(timer_.get(), &drained, sizeof(drained));
    if (stop.stop_requested()) return;
    {
      std::lock_guard lock(queue_mu_);
      timer_set_ = false;            // it fired, or the worker runs the queue now anyway
      if (queue_.empty()) continue;  // waiting callers ran them within their grace
      if (queue_.front().not_before > Clock::now()) {
        arm_timer_locked(queue_.front().not_before);
        continue;
      }
    }
    std::lock_guard run(run_mu_);
    while (run_next()) {
    }
  }
}

void Executor::shutdown(std::exception_ptr error) {
  std::deque<Queued> left;
  {
    std::lock_guard lock(queue_mu_);
    left.swap(queue_);
    queued_.store(0, std::memory_order_release);
  }
  for (auto& q : left) q.work->fail(error);
  if (thread_.joinable()) {
    thread_.request_stop();
    wake_worker();
    thread_.join();
  }
}

}  // namespace dtrain::comm
