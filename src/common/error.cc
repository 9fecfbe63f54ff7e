#include "dtrain/error.h"

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

}  // namespace dtrain
