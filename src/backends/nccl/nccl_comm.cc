#include "backends/nccl/nccl_comm.h"

#include <atomic>
#include <thread>

#include <fmt/format.h>

#include "comm/cuda/cuda_runtime.h"
#include "common/error_message.h"
#include "dtrain/error.h"

namespace dtrain::backends::nccl {
namespace {

std::string_view name_of(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclResult";
  }
}

// Yields at first, then sleeps in short steps: a wait of seconds costs little CPU.
void back_off(int spins) {
  if (spins < 100)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(spins < 1000 ? 20 : 500));
}

}  // namespace

std::string error_text(ncclResult_t result) {
  std::string text = fmt::format("{} ({}): {}", name_of(result), static_cast<int>(result),
                                 ncclGetErrorString(result));
  const char* last = ncclGetLastError(nullptr);
  if (last && *last) text += fmt::format("; NCCL's last error: {}", last);
  return text;
}

std::exception_ptr error_of(ncclResult_t result, std::string_view what) {
  const std::string text = fmt::format("{}: {}", what, error_text(result));
  if (result == ncclInvalidArgument || result == ncclInvalidUsage)
    return std::make_exception_ptr(InvalidArgumentError(
        text +
        " (NCCL refused the call: ranks that disagree on the arguments, or two ranks on "
        "one GPU, which NCCL cannot do: with fewer GPUs than ranks use "
        "DTRAIN_BACKEND=native, which stages CUDA tensors through host memory; "
        "NCCL_DEBUG=WARN prints NCCL's own account)"));
  return std::make_exception_ptr(PeerFailureError(
      text +
      " (a peer died, or the network or a GPU failed: look at the other ranks' errors; "
      "NCCL_DEBUG=WARN prints NCCL's own account)"));
}

std::exception_ptr failed_because(std::exception_ptr cause, std::string_view what) {
  const std::string text = fmt::format("{} failed: {}", what, message_of(cause));
  try {
    std::rethrow_exception(cause);
  } catch (const AbortedError&) {
    return std::make_exception_ptr(AbortedError(text));
  } catch (...) {
  }
  return std::make_exception_ptr(PeerFailureError(text));
}

std::shared_ptr<NcclComm> NcclComm::start(const ncclUniqueId& id, int rank, int size, int device,
                                          const std::string& name) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait is ours, with a deadline
  config.commName = name.c_str();
  cuda::DeviceGuard guard(device);
  ncclComm_t comm = nullptr;
  const ncclResult_t rc = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    if (comm) ncclCommAbort(comm);
    std::rethrow_exception(error_of(
        rc, fmt::format("ncclCommInitRankConfig of communicator {} (rank {} of {}, cuda:{})", name,
                        rank, size, device)));
  }
  return std::shared_ptr<NcclComm>(new NcclComm(comm, device));
}

std::shared_ptr<NcclComm> NcclComm::join(const ncclUniqueId& id, int rank, int size, int device,
                                         const std::string& name, const Deadline& deadline,
                                         const std::string& what) {
  auto comm = start(id, rank, size, device, name);
  std::unique_lock lock(comm->mu_);
  comm->settle_locked(lock, deadline, what);
  return comm;
}

std::shared_ptr<NcclComm> NcclComm::split(int color, int key, const std::string& name,
                                          const Deadline& deadline, const std::string& what) {
  std::unique_lock lock(mu_);
  if (failure_)
    throw PeerFailureError(
        fmt::format("{} cannot start: the NCCL communicator is unusable since: {}", what,
                    message_of(failure_)));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = name.c_str();
  cuda::DeviceGuard guard(device_);
  // A non-blocking split returns before the new communicator exists: NCCL's job writes its
  // handle into *slot when it completes, which polling this communicator drives. So the slot
  // must stay put until then, and the handle is read only after.
  auto slot = std::make_unique<ncclComm_t>(nullptr);
  const ncclResult_t rc = ncclCommSplit(comm_, color, key, slot.get(), &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    if (*slot) ncclCommAbort(*slot);
    auto e = error_of(rc, what + ": ncclCommSplit");
    fail_locked(e);
    std::rethrow_exception(e);
  }
  const auto handle = [&] {
    return std::atomic_ref<ncclComm_t>(*slot).load(std::memory_order_acquire);
  };
  try {
    for (int spins = 0;; ++spins) {
      settle_locked(lock, deadline, what);  // polling drives the split's job to its end
      if (color == NCCL_SPLIT_NOCOLOR || handle()) break;
      if (deadline.expired()) {
        auto e = std::make_exception_ptr(TimeoutError(fmt::format(
            "{}: ncclCommSplit gave no communicator within {} although NCCL reports no error; "
            "the NCCL communicator was aborted",
            what, deadline.describe())));
        fail_locked(e);
        std::rethrow_exception(e);
      }
      lock.unlock();
      back_off(spins);
      lock.lock();
    }
  } catch (...) {
    // This communicator is aborted, but the abandoned job might still write the slot: it is
    // left to it (8 bytes, once per failed split).
    (void)slot.release();
    throw;
  }
  std::shared_ptr<NcclComm> child(handle() ? new NcclComm(handle(), device_) : nullptr);
  if (child) {
    std::unique_lock child_lock(child->mu_);
    child->settle_locked(child_lock, deadline, what);
  }
  return child;
}

NcclComm::~NcclComm() {
  std::lock_guard lock(mu_);
  if (comm_) ncclCommAbort(comm_);
}

ncclResult_t NcclComm::state_locked() {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
  return rc != ncclSuccess ? rc : state;
}

void NcclComm::fail_locked(std::exception_ptr error) {
  if (!failure_) failure_ = std::move(error);
  if (comm_) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

void NcclComm::settle_locked(std::unique_lock<std::mutex>& lock, const Deadline& deadline,
                             std::string_view what) {
  for (int spins = 0;; ++spins) {
    if (!comm_) std::rethrow_exception(failure_);  // aborted meanwhile
    const ncclResult_t state = state_locked();
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      auto e = error_of(state, what);
      fail_locked(e);
      std::rethrow_exception(e);
    }
    if (deadline.expired()) {
      auto e = std::make_exception_ptr(TimeoutError(fmt::format(
          "{} did not finish within {}: NCCL still reports it in progress, so some rank has not "
          "joined (missing, slow, or unable to reach this one: check NCCL_SOCKET_IFNAME); the "
          "NCCL communicator was aborted",
          what, deadline.describe())));
      fail_locked(e);
      std::rethrow_exception(e);
    }
    // Only pollers (check_async, ready) and abort() may run between two polls: the callers that
    // issue hold their group's lock, and NCCL allows polling and aborting meanwhile.
    lock.unlock();
    back_off(spins);
    lock.lock();
  }
}

bool NcclComm::ready(std::string_view what) {
  std::lock_guard lock(mu_);
  if (failure_) std::rethrow_exception(failure_);
  const ncclResult_t state = state_locked();
  if (state == ncclSuccess) return true;
  if (state == ncclInProgress) return false;
  auto e = error_of(state, what);
  fail_locked(e);
  std::rethrow_exception(e);
}

void NcclComm::issue(const std::function<ncclResult_t(ncclComm_t)>& call, const Deadline& deadline,
                     std::string_view what) {
  std::unique_lock lock(mu_);
  if (failure_)
    throw PeerFailureError(
        fmt::format("{} cannot start: the NCCL communicator is unusable since: {}", what,
                    message_of(failure_)));
  cuda::DeviceGuard guard(device_);
  const ncclResult_t rc = call(comm_);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    auto e = error_of(rc, what);
    fail_locked(e);
    std::rethrow_exception(e);
  }
  settle_locked(lock, deadline, what);
}

std::exception_ptr NcclComm::check_async(std::string_view what) {
  std::lock_guard lock(mu_);
  if (failure_ || !comm_) return failure_;
  const ncclResult_t state = state_locked();
  if (state == ncclSuccess || state == ncclInProgress) return nullptr;
  auto e = error_of(state, fmt::format("{}: NCCL reports an error of the communicator", what));
  fail_locked(e);
  return e;
}

std::exception_ptr NcclComm::failure() const {
  std::lock_guard lock(mu_);
  return failure_;
}

void NcclComm::abort(std::exception_ptr reason) {
  std::lock_guard lock(mu_);
  fail_locked(std::move(reason));
}

}  // namespace dtrain::backends::nccl
