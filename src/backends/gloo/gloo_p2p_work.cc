#include "backends/gloo/gloo_p2p_work.h"

#include <fmt/format.h>
#include <gloo/common/error.h>

#include "dtrain/error.h"

namespace dtrain::backends {

GlooP2pWork::GlooP2pWork(gloo::Context& context, Kind kind, const TensorView& tensor, int peer,
                         uint64_t slot, Deadline deadline, std::string what)
    : kind_(kind), deadline_(deadline), what_(std::move(what)), bytes_(tensor.nbytes()) {
  buffer_ = context.createUnboundBuffer(tensor.data, tensor.nbytes());
  if (kind_ == Kind::kSend)
    buffer_->send(peer, slot);
  else
    buffer_->recv(peer, slot);
  waiter_ = std::jthread([this] { run(); });
}

GlooP2pWork::~GlooP2pWork() {
  cancel(std::make_exception_ptr(
      AbortedError(fmt::format("{}: its Work was destroyed before it completed", what_))));
  // The jthread joins here: the waiter returns at once after the cancel.
}

void GlooP2pWork::run() {
  std::exception_ptr error;
  try {
    bool done = kind_ == Kind::kSend ? buffer_->waitSend(deadline_.remaining())
                                     : buffer_->waitRecv(deadline_.remaining());
    if (!done) {
      std::lock_guard lock(mu_);
      error = cancel_error_;
    }
  } catch (const gloo::IoException& e) {
    const std::string text(e.what());
    if (text.find("Timed out") != std::string::npos)
      error = std::make_exception_ptr(TimeoutError(fmt::format(
          "{} did not complete within {}; gloo closed the group's connections on the timeout, "
          "so the group is unusable: {}",
          what_, deadline_.describe(), text)));
    else
      error = std::make_exception_ptr(PeerFailureError(
          fmt::format("{} failed after {}: {}", what_, deadline_.describe(), text)));
  } catch (const std::exception& e) {
    error = std::make_exception_ptr(PeerFailureError(
        fmt::format("{} failed after {}: {}", what_, deadline_.describe(), e.what())));
  }
  {
    // Gone before the Work completes: from here on gloo cannot write into the caller's memory.
    std::lock_guard lock(mu_);
    buffer_.reset();
    if (!error && cancel_error_) error = cancel_error_;
  }
  if (error)
    completion_.fail(error);
  else
    completion_.succeed();
}

void GlooP2pWork::cancel(std::exception_ptr error) {
  std::lock_guard lock(mu_);
  if (!buffer_) return;  // already ended
  if (!cancel_error_) cancel_error_ = std::move(error);
  if (kind_ == Kind::kSend)
    buffer_->abortWaitSend();
  else
    buffer_->abortWaitRecv();
}

void GlooP2pWork::wait_until_done(std::optional<std::chrono::milliseconds> timeout) {
  // The waiter enforces the operation's own deadline; the slack covers noticing it.
  const Deadline limit = timeout ? Deadline::after(*timeout)
                                 : Deadline::after(deadline_.remaining() + std::chrono::seconds(5));
  while (!completion_.done() && !limit.expired())
    completion_.wait_until(std::min(Clock::now() + std::chrono::seconds(1), limit.at()));
  if (!completion_.done()) {
    cancel(std::make_exception_ptr(TimeoutError(
        fmt::format("{}: wait gave up after {} ({} bytes); the operation was cancelled", what_,
                    limit.describe(), bytes_))));
    completion_.wait_until(Clock::now() + std::chrono::seconds(5));
  }
  if (!completion_.done())
    throw InternalError(
        fmt::format("{}: gloo did not return from a cancelled wait within 5 s", what_));
  if (auto e = completion_.error()) std::rethrow_exception(e);
}

}  // namespace dtrain::backends
