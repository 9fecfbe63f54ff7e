#include "dtrain/preemption.h"

#include <atomic>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "common/log.h"
#include "dtrain/error.h"
#include "dtrain/process_group.h"

namespace dtrain {
namespace {

// What the handler may touch: a lock-free atomic (async-signal-safe). 0: no warning yet.
std::atomic<int> caught{0};
static_assert(std::atomic<int>::is_always_lock_free);
std::atomic<bool> installed{false};

extern "C" void record_signal(int sig) {
  int expected = 0;
  caught.compare_exchange_strong(expected, sig);  // the first warning is the one reported
}

}  // namespace

Preemption::Preemption(std::shared_ptr<ProcessGroup> pg, PreemptionOptions options)
    : pg_(std::move(pg)), options_(std::move(options)) {
  if (!pg_) throw InvalidArgumentError("Preemption: needs a process group");
  if (options_.check_every < 1)
    throw InvalidArgumentError(
        fmt::format("Preemption: check_every is {}; it must be at least 1", options_.check_every));
  if (installed.exchange(true))
    throw InvalidArgumentError(
        "Preemption: another Preemption is alive in this process; keep one for the whole run");
  caught = 0;
  struct sigaction act {};
  act.sa_handler = record_signal;
  sigemptyset(&act.sa_mask);
  act.sa_flags = SA_RESTART;  // a read or write the signal interrupts goes on
  for (int sig : options_.signals) {
    struct sigaction old {};
    if (::sigaction(sig, &act, &old) != 0) {
      const int err = errno;
      for (size_t i = 0; i < previous_.size(); ++i)
        ::sigaction(options_.signals[i], &previous_[i], nullptr);
      installed = false;
      throw InvalidArgumentError(
          fmt::format("Preemption: cannot catch signal {}: {}", sig, std::strerror(err)));
    }
    previous_.push_back(old);
  }
}

Preemption::~Preemption() {
  for (size_t i = 0; i < previous_.size(); ++i)
    ::sigaction(options_.signals[i], &previous_[i], nullptr);
  installed = false;
}

int Preemption::signal() const { return caught.load(); }

int Preemption::requeue() {
  pg_->barrier()->wait();
  return kRequeueExitCode;
}

bool Preemption::should_stop() {
  if (stopping_) return true;
  if (++calls_ % options_.check_every != 0) return false;
  std::vector<int32_t> flag{caught.load() != 0 ? 1 : 0};
  pg_->allreduce(TensorView::of(flag), AllreduceOptions{.op = ReduceOp::kMax})->wait();
  if (flag[0] == 0) return false;
  stopping_ = true;
  if (const int sig = caught.load()) {
    const char* abbrev = ::sigabbrev_np(sig);  // "TERM"
    DTRAIN_LOG_INFO(
        "rank {}: preempted by SIG{}; stopping after step boundary {} with the other "
        "{} rank(s)",
        pg_->rank(), abbrev != nullptr ? abbrev : std::to_string(sig), calls_, pg_->size() - 1);
  } else {
    DTRAIN_LOG_INFO(
        "rank {}: another rank was warned of a preemption; stopping after step "
        "boundary {} with it",
        pg_->rank(), calls_);
  }
  return true;
}

}  // namespace dtrain
