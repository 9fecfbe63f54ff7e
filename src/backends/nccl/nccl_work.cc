#include "backends/nccl/nccl_work.h"

#include <thread>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::backends::nccl {

NcclWork::NcclWork(std::shared_ptr<NcclComm> comm, std::shared_ptr<cuda::Event> done,
                   std::string what, Deadline deadline)
    : comm_(std::move(comm)), done_(std::move(done)), what_(std::move(what)), deadline_(deadline) {}

std::shared_ptr<NcclWork> NcclWork::failed(std::exception_ptr error) {
  std::shared_ptr<NcclWork> work(new NcclWork());
  work->completion_.fail(std::move(error));
  return work;
}

bool NcclWork::poll_locked() {
  if (completion_.done()) return true;
  // The communicator first: once it was aborted (a timeout, abort()), its kernels end early and
  // their events complete, so an event alone no longer means success.
  if (auto cause = comm_->check_async(what_)) {
    completion_.fail(failed_because(cause, what_));
    return true;
  }
  try {
    if (done_->done(what_)) {
      completion_.succeed();
      return true;
    }
  } catch (...) {
    // A CUDA error on the stream (the GPU faulted): nothing more will run on it.
    comm_->abort(std::current_exception());
    completion_.fail(std::current_exception());
    return true;
  }
  return false;
}

void NcclWork::time_out_locked(const Deadline& limit) {
  auto error = std::make_exception_ptr(TimeoutError(fmt::format(
      "{} did not complete within {}; NCCL cannot cancel one operation, so this rank aborted the "
      "group's NCCL communicator and the group is unusable from now on (a peer did not call the "
      "same operation, or is stuck or dead: look at the other ranks' errors)",
      what_, limit.describe())));
  comm_->abort(error);
  completion_.fail(error);
}

bool NcclWork::is_completed() {
  std::lock_guard lock(mu_);
  if (poll_locked()) return true;
  if (deadline_.expired()) time_out_locked(deadline_);
  return completion_.done();
}

void NcclWork::wait_until_done(std::optional<std::chrono::milliseconds> timeout) {
  const Deadline limit = timeout ? Deadline::after(*timeout) : deadline_;
  for (int spins = 0;; ++spins) {
    {
      std::lock_guard lock(mu_);
      if (poll_locked()) break;
      if (limit.expired()) {
        time_out_locked(limit);
        break;
      }
    }
    if (spins < 100)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(spins < 1000 ? 20 : 200));
  }
  if (auto e = completion_.error()) std::rethrow_exception(e);
}

}  // namespace dtrain::backends::nccl
