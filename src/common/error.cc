#include "dtrain/error.h"

#include <cerrno>
#include <new>

#include "common/error_message.h"

namespace dtrain {

std::string_view to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return "invalid argument";
    case ErrorKind::kTimeout:
      return "timeout";
    case ErrorKind::kPeerFailure:
      return "peer failure";
    case ErrorKind::kStore:
      return "store error";
    case ErrorKind::kAborted:
      return "aborted";
    case ErrorKind::kInternal:
      return "internal error";
    case ErrorKind::kDataLoss:
      return "data loss";
    case ErrorKind::kResourceExhausted:
      return "resource exhausted";
    case ErrorKind::kUnavailable:
      return "unavailable";
  }
  return "unknown error";
}

Error::Error(ErrorKind kind, const std::string& message)
    : std::runtime_error(message), kind_(kind) {}

bool Error::retryable() const {
  return kind_ == ErrorKind::kTimeout || kind_ == ErrorKind::kStore ||
         kind_ == ErrorKind::kUnavailable;
}

std::exception_ptr make_error(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return std::make_exception_ptr(InvalidArgumentError(message));
    case ErrorKind::kTimeout:
      return std::make_exception_ptr(TimeoutError(message));
    case ErrorKind::kPeerFailure:
      return std::make_exception_ptr(PeerFailureError(message));
    case ErrorKind::kStore:
      return std::make_exception_ptr(StoreError(message));
    case ErrorKind::kAborted:
      return std::make_exception_ptr(AbortedError(message));
    case ErrorKind::kDataLoss:
      return std::make_exception_ptr(DataLossError(message));
    case ErrorKind::kResourceExhausted:
      return std::make_exception_ptr(ResourceExhaustedError(message));
    case ErrorKind::kUnavailable:
      return std::make_exception_ptr(UnavailableError(message));
    case ErrorKind::kInternal:
      break;
  }
  return std::make_exception_ptr(InternalError(message));
}

void throw_error(ErrorKind kind, const std::string& message) {
  std::rethrow_exception(make_error(kind, message));
}

void rethrow_with_context(std::exception_ptr e, const std::string& context,
                          const std::string& after) {
  const std::string tail = after.empty() ? "" : ". " + after;
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    throw_error(err.kind(), context + ": " + err.what() + tail);
  } catch (const std::bad_alloc&) {
    throw ResourceExhaustedError(context + ": out of memory" + tail);
  } catch (const std::exception& err) {
    throw InternalError(context + ": " + err.what() + tail);
  } catch (...) {
    throw InternalError(context + ": an exception that is not a std::exception" + tail);
  }
}

ErrorKind kind_of_errno(int err) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      return ErrorKind::kResourceExhausted;
    case EIO:
      return ErrorKind::kDataLoss;
    case EINTR:
    case EAGAIN:
    case EBUSY:
    case ETIMEDOUT:
      return ErrorKind::kUnavailable;
    default:
      return ErrorKind::kInvalidArgument;
  }
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
