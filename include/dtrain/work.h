// Work: the handle of an operation in flight (a send, a receive, later a collective).
// wait() rethrows the operation's error; every wait is bounded by a timeout.
#pragma once

#include <chrono>
#include <exception>
#include <optional>

namespace dtrain {

class Work {
 public:
  virtual ~Work() = default;

  // True once the operation finished, successfully or not. Never blocks; may move bytes.
  virtual bool is_completed() = 0;
  // Waits for the operation. Without an argument it waits until the operation's own deadline
  // (its options' timeout, or the group default, counted from when it was issued). Throws the
  // operation's error, or TimeoutError, after which the operation is cancelled: a wait that
  // timed out never leaves a buffer that may still be written to. The time spent here is the
  // communication a training step did not hide behind its compute (communication_wait_time()).
  void wait(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  // The error the operation failed with, or null (also null while it is still running).
  virtual std::exception_ptr exception() const = 0;

  bool is_success() { return is_completed() && exception() == nullptr; }
  // The rank a receive from any source (ProcessGroup::irecv_any) took its message from, once
  // it completed; -1 for every other operation, and before then.
  virtual int source_rank() const { return -1; }

 protected:
  // What wait() does, for each kind of operation.
  virtual void wait_until_done(std::optional<std::chrono::milliseconds> timeout) = 0;
};

// How long this process's threads have spent in Work::wait since it started (a wait inside
// another, such as a staged CUDA operation's, counts once). Read it before and after a step:
// the difference is the step's exposed communication, the rest its compute.
std::chrono::nanoseconds communication_wait_time();

}  // namespace dtrain
