// dtrain's error kinds. Each says whether retrying can help; docs/errors.md says what to do.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

namespace dtrain {

enum class ErrorKind {
  kInvalidArgument,  // the caller asked for something impossible (sizes, ranks, dtypes); fix the
                     // call
  kTimeout,          // a wait ran past its limit; retry with a longer timeout or find the straggler
  kPeerFailure,      // a peer died or its connection broke; restart the job (or let elastic do it)
  kStore,            // the rendezvous store refused or lost us; check the master address/port/token
  kAborted,          // abort() was called on this group; the group is unusable
  kInternal,         // an invariant of dtrain itself broke: a bug, please report it
  // Storage (checkpoints, data files), as abseil's Status names them:
  kDataLoss,           // bytes are lost or corrupt (a failed fsync, EIO, a checksum mismatch)
  kResourceExhausted,  // out of space or quota (ENOSPC, EDQUOT), descriptors or memory
  kUnavailable,        // transient: busy or interrupted; the same call may succeed later
};

std::string_view to_string(ErrorKind kind);

// Base of every exception dtrain throws.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message);
  ErrorKind kind() const { return kind_; }
  // Whether the same call may succeed if simply retried (after a pause, or with a longer limit).
  bool retryable() const;

 private:
  ErrorKind kind_;
};

class InvalidArgumentError : public Error {
 public:
  explicit InvalidArgumentError(const std::string& m) : Error(ErrorKind::kInvalidArgument, m) {}
};
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& m) : Error(ErrorKind::kTimeout, m) {}
};
class PeerFailureError : public Error {
 public:
  explicit PeerFailureError(const std::string& m) : Error(ErrorKind::kPeerFailure, m) {}
};
class StoreError : public Error {
 public:
  explicit StoreError(const std::string& m) : Error(ErrorKind::kStore, m) {}
};
class AbortedError : public Error {
 public:
  explicit AbortedError(const std::string& m) : Error(ErrorKind::kAborted, m) {}
};
class InternalError : public Error {
 public:
  explicit InternalError(const std::string& m) : Error(ErrorKind::kInternal, m) {}
};

class DataLossError : public Error {
 public:
  explicit DataLossError(const std::string& m) : Error(ErrorKind::kDataLoss, m) {}
};
class ResourceExhaustedError : public Error {
 public:
  explicit ResourceExhaustedError(const std::string& m) : Error(ErrorKind::kResourceExhausted, m) {}
};
class UnavailableError : public Error {
 public:
  explicit UnavailableError(const std::string& m) : Error(ErrorKind::kUnavailable, m) {}
};

// The error class of `kind` with `message`: for code that adds context to an error and throws it
// on with its kind (its meaning for retrying) unchanged.
std::exception_ptr make_error(ErrorKind kind, const std::string& message);
[[noreturn]] void throw_error(ErrorKind kind, const std::string& message);
// The error `e` again, its kind kept, its message `context: <e's message>` and, when `after` is
// given, `. <after>` (a dtrain::Error; any other exception becomes an InternalError, a
// std::bad_alloc a ResourceExhaustedError).
[[noreturn]] void rethrow_with_context(std::exception_ptr e, const std::string& context,
                                       const std::string& after = "");

// The kind of a failed system call's errno: out of space or descriptors is kResourceExhausted,
// EIO kDataLoss, EINTR/EAGAIN/EBUSY kUnavailable, the rest (a path that does not exist, no
// permission, a read-only filesystem) kInvalidArgument: the caller's to fix.
ErrorKind kind_of_errno(int err);

}  // namespace dtrain
