#include "backends/mpi/mpi_work.h"

#include <thread>

#include <fmt/format.h>

#include "backends/mpi/mpi_runtime.h"
#include "dtrain/error.h"

namespace dtrain::backends::mpi {

MpiWork::MpiWork(Kind kind, std::string what, Deadline deadline,
                 std::function<void(std::exception_ptr)> on_stuck)
    : kind_(kind), what_(std::move(what)), deadline_(deadline), on_stuck_(std::move(on_stuck)) {}

MpiWork::~MpiWork() {
  // A receive still pending must not write into memory the caller may reuse: cancel it. Other
  // requests cannot be cancelled; they were or will be reported through on_stuck.
  std::lock_guard lock(mu_);
  if (!completion_.done() && kind_ == Kind::kRecv && !finalized())
    give_up_locked(std::make_exception_ptr(
        AbortedError(fmt::format("{}: its Work was destroyed before it completed", what_))));
}

bool MpiWork::test_locked() {
  if (completion_.done()) return true;
  if (request_ == MPI_REQUEST_NULL) {  // nothing was started (a count of zero, a world of one)
    completion_.succeed();
    return true;
  }
  int done = 0;
  MPI_Status status;
  int rc;
  {
    CallLock call;
    rc = MPI_Test(&request_, &done, &status);
  }
  if (rc != MPI_SUCCESS) {
    // MPI_ERR_IN_STATUS-style errors carry the real code in the status.
    const int code = rc == MPI_ERR_IN_STATUS ? status.MPI_ERROR : rc;
    completion_.fail(std::make_exception_ptr(PeerFailureError(
        fmt::format("{} failed after {}: {}", what_, deadline_.describe(), error_string(code)))));
    return true;
  }
  if (!done) return false;
  try {
    if (on_success_) on_success_(status);
    completion_.succeed();
  } catch (...) {
    completion_.fail(std::current_exception());
  }
  return true;
}

void MpiWork::give_up_locked(std::exception_ptr error) {
  if (completion_.done()) return;
  if (kind_ == Kind::kRecv && request_ != MPI_REQUEST_NULL) {
    {
      CallLock call;
      MPI_Cancel(&request_);
    }
    // A cancelled receive completes locally and at once; poll for it, within bounds.
    const Deadline settle = Deadline::after(std::chrono::seconds(5));
    int done = 0;
    MPI_Status status;
    while (!done && !settle.expired()) {
      {
        CallLock call;
        MPI_Test(&request_, &done, &status);
      }
      if (!done) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    int cancelled = 0;
    if (done) MPI_Test_cancelled(&status, &cancelled);
    if (done && !cancelled) {  // it completed after all, just before the cancel
      try {
        if (on_success_) on_success_(status);
        completion_.succeed();
      } catch (...) {
        completion_.fail(std::current_exception());
      }
      return;
    }
    completion_.fail(std::move(error));
    return;
  }
  completion_.fail(error);
  if (on_stuck_) on_stuck_(error);
}

bool MpiWork::is_completed() {
  std::lock_guard lock(mu_);
  if (test_locked()) return true;
  if (deadline_.expired()) {
    give_up_locked(std::make_exception_ptr(
        TimeoutError(fmt::format("{} did not complete within {}", what_, deadline_.describe()))));
  }
  return completion_.done();
}

void MpiWork::wait_until_done(std::optional<std::chrono::milliseconds> timeout) {
  const Deadline limit = timeout ? Deadline::after(*timeout) : deadline_;
  for (int spins = 0;; ++spins) {
    {
      std::lock_guard lock(mu_);
      if (test_locked()) break;
      if (limit.expired()) {
        const char* after = kind_ == Kind::kRecv
                                ? "; the receive was cancelled"
                                : "; MPI cannot cancel it, so the group is unusable from now on "
                                  "(MPI may still access its buffers)";
        give_up_locked(std::make_exception_ptr(TimeoutError(
            fmt::format("{} did not complete within {}{}", what_, limit.describe(), after))));
        break;
      }
    }
    // MPI progresses inside MPI_Test: poll eagerly at first, then back off to sleeps.
    if (spins < 200)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(spins < 2000 ? 20 : 200));
  }
  if (auto e = completion_.error()) std::rethrow_exception(e);
}

void MpiWork::cancel(std::exception_ptr error) {
  std::lock_guard lock(mu_);
  give_up_locked(std::move(error));
}

}  // namespace dtrain::backends::mpi
