#include "comm/any_source_work.h"

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "transport/wait.h"

namespace dtrain::comm {

AnySourceWork::AnySourceWork(std::vector<Peer> peers, uint64_t tag, TensorView tensor,
                             Deadline deadline, std::string what)
    : peers_(std::move(peers)),
      tag_(tag),
      tensor_(tensor),
      deadline_(deadline),
      what_(std::move(what)) {}

bool AnySourceWork::probe_locked() {
  if (request_ || error_) return true;
  size_t broken = 0;
  for (auto& p : peers_) {
    p.pair->try_progress();
    if (p.pair->has_unexpected(tag_)) {
      request_ = p.pair->irecv(tag_, tensor_.data, tensor_.nbytes(), deadline_);
      source_ = p.group_rank;
      return true;
    }
    if (p.pair->broken_by() != transport::Pair::BrokenBy::kNothing) ++broken;
  }
  if (!peers_.empty() && broken == peers_.size()) {
    error_ = std::make_exception_ptr(PeerFailureError(fmt::format(
        "{}: every peer's connection is closed and none sent a message with this tag", what_)));
    return true;
  }
  if (peers_.empty()) {
    error_ = std::make_exception_ptr(InvalidArgumentError(
        fmt::format("{}: the group has no other rank to receive from", what_)));
    return true;
  }
  return false;
}

bool AnySourceWork::is_completed() {
  std::shared_ptr<transport::Request> r;
  {
    std::lock_guard lock(mu_);
    if (!probe_locked()) {
      if (deadline_.expired())
        error_ = std::make_exception_ptr(TimeoutError(fmt::format(
            "{}: no rank sent a message with this tag within {}", what_, deadline_.describe())));
      return error_ != nullptr;
    }
    if (error_) return true;
    r = request_;
  }
  if (r->completion.done()) return true;
  r->pair->try_progress();
  return r->completion.done();
}

void AnySourceWork::wait_until_done(std::optional<std::chrono::milliseconds> timeout) {
  const Deadline limit = timeout ? Deadline::after(*timeout) : deadline_;
  auto pause = std::chrono::microseconds(20);
  std::shared_ptr<transport::Request> r;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (probe_locked()) {
        if (error_) std::rethrow_exception(error_);
        r = request_;
        break;
      }
    }
    if (limit.expired()) {
      auto e = std::make_exception_ptr(TimeoutError(fmt::format(
          "{}: no rank sent a message with this tag within {}; the sender may be missing its "
          "send, or use another tag",
          what_, limit.describe())));
      std::lock_guard lock(mu_);
      error_ = e;  // nothing was posted: the receive is simply over
      std::rethrow_exception(e);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
  }
  transport::wait_request(*r, limit);
}

std::exception_ptr AnySourceWork::exception() const {
  std::lock_guard lock(mu_);
  if (error_) return error_;
  return request_ ? request_->completion.error() : nullptr;
}

int AnySourceWork::source_rank() const {
  std::lock_guard lock(mu_);
  return request_ && request_->completion.done() && !request_->completion.error() ? source_ : -1;
}

}  // namespace dtrain::comm
