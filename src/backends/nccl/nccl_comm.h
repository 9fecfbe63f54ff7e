// One NCCL communicator, owned: created non-blocking (ncclConfig_t::blocking = 0) so that every
// wait on NCCL, joining included, is a poll of ncclCommGetAsyncError that dtrain bounds with a
// deadline; aborted (ncclCommAbort) on a timeout, on abort() and when the last owner lets go,
// since ncclCommDestroy could wait forever on work a dead peer never finishes.
//
// Once an error, a timeout or an abort has hit it, the communicator is unusable: failure()
// says why, and every later call fails with that reason.
#pragma once

#include <nccl.h>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "the nccl backend needs NCCL 2.18 or later (ncclCommSplit, non-blocking communicators)"
#endif

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "common/deadline.h"

namespace dtrain::backends::nccl {

// "ncclRemoteError: remote process exited or there was a network error (NCCL: <last error>)"
std::string error_text(ncclResult_t result);

// The dtrain error for a failed NCCL call: InvalidArgumentError for misuse (two ranks on one GPU,
// bad arguments), PeerFailureError for everything else (a peer died, the network or the GPU
// failed). `what` names the call.
std::exception_ptr error_of(ncclResult_t result, std::string_view what);

// The error of an operation `what` that could not complete because its communicator failed with
// `cause`: "<what> failed: <cause>", an AbortedError when the group was aborted, else a
// PeerFailureError.
std::exception_ptr failed_because(std::exception_ptr cause, std::string_view what);

class NcclComm {
 public:
  // Starts joining communicator `id` as `rank` of `size` on `device`, and returns at once:
  // ready() says when every rank has joined. `name` shows up in NCCL's own logs.
  static std::shared_ptr<NcclComm> start(const ncclUniqueId& id, int rank, int size, int device,
                                         const std::string& name);
  // start(), then waits until every rank has joined, at most until `deadline` (TimeoutError
  // beginning with `what` otherwise, the communicator aborted).
  static std::shared_ptr<NcclComm> join(const ncclUniqueId& id, int rank, int size, int device,
                                        const std::string& name, const Deadline& deadline,
                                        const std::string& what);

  // A communicator of the ranks that pass the same `color`, ordered by `key`; null for
  // NCCL_SPLIT_NOCOLOR. Every rank of this communicator must call it, in the same place of
  // their sequence of operations; it waits for them at most until `deadline`.
  std::shared_ptr<NcclComm> split(int color, int key, const std::string& name,
                                  const Deadline& deadline, const std::string& what);

  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int device() const { return device_; }

  // True once joining (or the last call) has finished; throws (recording the failure, aborting
  // the communicator) when NCCL reports an error.
  bool ready(std::string_view what);
  // Runs `call` (one NCCL call, or a ncclGroupStart..ncclGroupEnd) on the communicator, then
  // waits while NCCL says it is still in progress, at most until `deadline`. Throws the call's
  // error, TimeoutError, or the reason the communicator is unusable; any of these but an
  // exception thrown by `call` itself leaves it unusable.
  void issue(const std::function<ncclResult_t(ncclComm_t)>& call, const Deadline& deadline,
             std::string_view what);
  // An error NCCL found since (a peer died, the network failed): recorded and returned, the
  // communicator aborted. Null while all is well. Never blocks.
  std::exception_ptr check_async(std::string_view what);

  // Why the communicator is unusable, or null.
  std::exception_ptr failure() const;
  // Aborts the communicator (once; later calls only keep the first reason): operations in
  // flight end, future ones fail with `reason`.
  void abort(std::exception_ptr reason);

 private:
  NcclComm(ncclComm_t comm, int device) : comm_(comm), device_(device) {}
  // Polls NCCL's state of the communicator. Caller holds mu_.
  ncclResult_t state_locked();
  // Records `error`, aborts. Caller holds mu_.
  void fail_locked(std::exception_ptr error);
  // Waits while the state is ncclInProgress; throws on error or at the deadline. `lock` holds
  // mu_; it is let go between polls, so that others may poll or abort meanwhile.
  void settle_locked(std::unique_lock<std::mutex>& lock, const Deadline& deadline,
                     std::string_view what);

  mutable std::mutex mu_;      // guards comm_ (NCCL calls on one communicator are not thread-safe)
                               // and failure_
  ncclComm_t comm_ = nullptr;  // null once aborted
  int device_;
  std::exception_ptr failure_;
};

}  // namespace dtrain::backends::nccl
