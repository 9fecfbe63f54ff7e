// Executor: runs a group's collectives one at a time, in call order, on the group's worker
// thread. A thread that waits on a collective nobody has started yet runs the queue itself
// (the worker is busy or asleep): a synchronous call then costs no hand-off between threads.
//
// The worker sleeps in poll(2) on an eventfd (a collective to start now) and a timerfd (one to
// start once its grace is over). A collective submitted with a grace wakes nobody, and a caller
// that waits for it within the grace runs it itself: a blocking call built on an asynchronous one
// costs no context switch of another thread (on 2 cores with 2 ranks that switch lands on the
// core of the other rank, mid-collective). The timer is set by the first such submit and then
// left alone until it fires, since setting one costs tens of microseconds in a VM
// (docs/performance.md, "PyTorch on dtrain"): a collective nobody waits for starts within one
// to two graces.
#pragma once

#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/collective.h"
#include "common/completion.h"
#include "common/deadline.h"
#include "common/socket.h"
#include "dtrain/work.h"

namespace dtrain::comm {

class Executor;

class CollectiveWork : public Work {
 public:
  // Who called which collective, formatted only for errors and logs.
  struct Label {
    int rank = 0;
    CollectiveCall call;
    uint32_t seq = 0;
    std::string group;
    std::string text;  // a description made up front (other backends): used as is
    // "rank 0: all_reduce(f32, 1024, sum) as collective #3 of group world"
    std::string describe() const;
  };

  CollectiveWork(std::function<void()> body, Deadline deadline, Label label,
                 std::weak_ptr<Executor> executor)
      : body_(std::move(body)),
        deadline_(deadline),
        label_(std::move(label)),
        executor_(std::move(executor)) {}
  CollectiveWork(std::function<void()> body, Deadline deadline, std::string what,
                 std::weak_ptr<Executor> executor)
      : CollectiveWork(std::move(body), deadline, Label{.text = std::move(what)},
                       std::move(executor)) {}

  bool is_completed() override { return completion_.done(); }
  void wait_until_done(std::optional<std::chrono::milliseconds> timeout) override;
  std::exception_ptr exception() const override { return completion_.error(); }

  // Runs the body once (on whichever thread gets there first) and records how it ended.
  void run();
  void fail(std::exception_ptr error) { completion_.fail(std::move(error)); }
  std::string what() const { return label_.describe(); }

 private:
  std::function<void()> body_;
  Deadline deadline_;
  Label label_;
  std::weak_ptr<Executor> executor_;
  Completion completion_;
};

struct ExecutorOptions {
  // How long a thread waiting for a collective the worker runs busy-polls before it sleeps
  // (DTRAIN_SPIN_US; 0: never): a quick collective ends before a sleep would even begin.
  std::chrono::microseconds spin{50};
  // False where the machine's ranks outnumber its cores: then a wait inside another collective
  // (the hierarchical forms' inner ones) sleeps at once, since the inner group's worker needs
  // the core it would spin on; the caller's own wait still spins (measured,
  // docs/performance.md).
  bool spin_inside_collectives = true;
};

class Executor : public std::enable_shared_from_this<Executor> {
 public:
  friend class CollectiveWork;
  // on_failure is called (on the running thread) when a collective fails, before its Work
  // completes; it decides what the failure does to the group.
  explicit Executor(std::function<void(std::exception_ptr)> on_failure,
                    ExecutorOptions options = {});
  ~Executor();
  void start();

  // Queues `work` for the worker. With a grace, the worker leaves it that long first: a thread
  // that waits for it meanwhile runs it itself (help), with no hand-off between threads, as a
  // caller of a blocking API built on asynchronous calls does (torch's dist.all_reduce).
  void submit(std::shared_ptr<CollectiveWork> work,
              std::chrono::microseconds grace = std::chrono::microseconds(0));
  // A synchronous call with nothing ahead of it (nothing queued, nothing running): runs `f`
  // on this thread at once, with no work object, queue entry or hand-off, and returns true;
  // an error `f` throws goes to on_failure and into `error`. False (nothing done) otherwise:
  // then the call goes through run_here.
  template <typename F>
  bool run_inline(F&& f, std::exception_ptr& error) {
    std::unique_lock run(run_mu_, std::try_to_lock);
    if (!run.owns_lock() || !queue_empty()) return false;
    try {
      const InCollective scope;
      f();
    } catch (...) {
      error = std::current_exception();
      on_failure_(error);
    }
    return true;
  }
  // Queues `work` and runs the queue on this thread until it has run, without waking the
  // worker (a synchronous call); if the worker is busy with an earlier collective, the worker
  // runs it next, in order, and this waits for it. Returns with `work` finished.
  void run_here(std::shared_ptr<CollectiveWork> work);
  // Runs queued collectives on this thread until `work` has started (or another thread is
  // running the queue).
  void help(const CollectiveWork* work);
  // Fails every queued collective with `error` and stops the worker.
  void shutdown(std::exception_ptr error);

 private:
  // Marks this thread as running a collective's body (see CollectiveWork::run) while alive.
  struct InCollective {
    InCollective();
    ~InCollective();
    bool outer;
  };
  bool queue_empty() const { return queued_.load(std::memory_order_acquire) == 0; }
  void worker(std::stop_token stop);
  // Pops and runs the next collective; false when the queue is empty.
  bool run_next();
  void wake_worker();
  // Sets the timer to fire at `when` (queue_mu_ held).
  void arm_timer_locked(Clock::time_point when);

  std::function<void(std::exception_ptr)> on_failure_;
  const ExecutorOptions options_;
  net::Fd wake_;            // eventfd: a collective to start now, or stop
  net::Fd timer_;           // timerfd: the first queued collective's grace is over
  std::mutex queue_mu_;     // guards queue_ and timer_set_
  bool timer_set_ = false;  // the timer will fire (and clear this)
  struct Queued {
    std::shared_ptr<CollectiveWork> work;
    Clock::time_point not_before;  // the worker's earliest start (see submit's grace)
  };
  std::deque<Queued> queue_;
  std::atomic<size_t> queued_{0};  // queue_.size(), for a look without queue_mu_
  std::mutex run_mu_;              // held while a collective runs: one at a time, in queue order
  std::jthread thread_;
};

}  // namespace dtrain::comm
