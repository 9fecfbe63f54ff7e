// What the gloo and MPI groups share about failing. The first failure (an operation that broke
// or was abandoned, or abort()) makes the group unusable: every later operation fails at its
// start naming that cause. abort() and the group's destruction end the operations in flight.
// (The native group, which tells its peers and keeps collectives apart by sequence number, has
// its own in comm/process_group.cc.)
#pragma once

#include <algorithm>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "common/error_message.h"
#include "common/log.h"
#include "dtrain/error.h"

namespace dtrain::backends {

// `Op`: the backend's work in flight, with cancel(std::exception_ptr). Every member is guarded
// by the group's mutex, which the caller holds.
template <class Op>
class GroupFailure {
 public:
  // Records `error` unless a failure came first.
  void set(std::exception_ptr error) {
    if (!cause_) cause_ = std::move(error);
  }
  std::exception_ptr cause() const { return cause_; }
  // The error of an operation (`what`) that cannot start since the group failed.
  PeerFailureError cannot_start(std::string_view what) const {
    return PeerFailureError(
        fmt::format("{} cannot start: the group is unusable since: {}", what, message_of(cause_)));
  }
  // Remembers an operation in flight for abort() (and drops those that are over).
  void track(const std::shared_ptr<Op>& op) {
    std::erase_if(in_flight_, [](const auto& w) { return w.expired(); });
    in_flight_.push_back(op);
  }
  std::vector<std::weak_ptr<Op>> take_in_flight() { return std::exchange(in_flight_, {}); }

 private:
  std::exception_ptr cause_;
  std::vector<std::weak_ptr<Op>> in_flight_;
};

// Ends what is in flight with `error`, outside the group's mutex.
template <class Op>
void cancel_all(std::vector<std::weak_ptr<Op>> ops, const std::exception_ptr& error) {
  for (auto& w : ops)
    if (auto op = w.lock()) op->cancel(error);
}

// ProcessGroup::abort of a backend's group: logs, makes the group unusable with an AbortedError
// naming `reason`, and cancels what is in flight.
template <class Op>
void abort_group(std::mutex& mu, GroupFailure<Op>& failure, int rank, const std::string& group,
                 std::string_view backend, const std::string& reason) {
  DTRAIN_LOG_WARN("rank {}: group {} ({}) aborted: {}", rank, group, backend, reason);
  auto error = std::make_exception_ptr(AbortedError(
      fmt::format("rank {}: group {} ({}) was aborted: {}", rank, group, backend, reason)));
  std::vector<std::weak_ptr<Op>> in_flight;
  {
    std::lock_guard lock(mu);
    failure.set(error);
    in_flight = failure.take_in_flight();
  }
  cancel_all(std::move(in_flight), error);
}

// This rank's index in a new group's list of members, or -1 when it is not one.
inline int index_in(const std::vector<int>& ranks, int rank) {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}

}  // namespace dtrain::backends
