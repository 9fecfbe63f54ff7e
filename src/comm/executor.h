// Executor: runs a group's collectives one at a time, in call order, on the group's worker
// thread. A thread that waits on a collective nobody has started yet runs the queue itself
// (the worker is busy or asleep): a synchronous call then costs no hand-off between threads.
#pragma once

#include <condition_variable>
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
      : body_(std::move(body)), deadline_(deadline), label_(std::move(label)),
        executor_(std::move(executor)) {}
  CollectiveWork(std::function<void()> body, Deadline deadline, std::string what,
                 std::weak_ptr<Executor> executor)
      : CollectiveWork(std::move(body), deadline, Label{.text = std::move(what)},
                       std::move(executor)) {}

  bool is_completed() override { return completion_.done(); }
  void wait(std::optional<std::chrono::milliseconds> timeout) override;
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

class Executor : public std::enable_shared_from_this<Executor> {
 public:
  friend class CollectiveWork;
  // on_failure is called (on the running thread) when a collective fails, before its Work
  // completes; it decides what the failure does to the group.
  explicit Executor(std::function<void(std::exception_ptr)> on_failure);
  ~Executor();
  void start();

  void submit(std::shared_ptr<CollectiveWork> work);
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
  void worker(std::stop_token stop);
  // Pops and runs the next collective; false when the queue is empty.
  bool run_next();

  std::function<void(std::exception_ptr)> on_failure_;
  std::mutex queue_mu_;  // guards queue_
  std::condition_variable_any queue_cv_;
  std::deque<std::shared_ptr<CollectiveWork>> queue_;
  std::mutex run_mu_;  // held while a collective runs: one at a time, in queue order
  std::jthread thread_;
};

}  // namespace dtrain::comm
