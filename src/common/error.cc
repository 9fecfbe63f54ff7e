#include "dtrain/error.h"

#include "common/error_message.h"

namespace dtrain {

std::string_view to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kTimeout: return "timeout";
    case ErrorKind::kPeerFailure: return "peer failure";
    case ErrorKind::kStore: return "store error";
    case ErrorKind::kAborted: return "aborted";
    case ErrorKind::kInternal: return "internal error";
  }
  return "unknown error";
}

Error::Error(ErrorKind kind, const std::string& message)
    : std::runtime_error(message), kind_(kind) {}

bool Error::retryable() const {
  return kind_ == ErrorKind::kTimeout || kind_ == ErrorKind::kStore;
}

std::exception_ptr make_error(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return std::make_exception_ptr(InvalidArgumentError(message));
    case ErrorKind::kTimeout: return std::make_exception_ptr(TimeoutError(message));
    case ErrorKind::kPeerFailure: return std::make_exception_ptr(PeerFailureError(message));
    case ErrorKind::kStore: return std::make_exception_ptr(StoreError(message));
    case ErrorKind::kAborted: return std::make_exception_ptr(AbortedError(message));
    case ErrorKind::kInternal: break;
  }
  return std::make_exception_ptr(InternalError(message));
}

void throw_error(ErrorKind kind, const std::string& message) {
  std::rethrow_exception(make_error(kind, message));
}

std::string message_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& err) {
    return err.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace dtrain
