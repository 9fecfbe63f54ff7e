#include "dtrain/work.h"

#include <atomic>

#include "comm/flight_recorder.h"
#include "comm/p2p_work.h"
#include "comm/wait_time.h"
#include "transport/wait.h"

namespace dtrain {
namespace {

std::atomic<int64_t> waited_ns{0};
thread_local int wait_depth = 0;  // a wait inside a wait (a staged work's) counts once

}  // namespace

void Work::wait(std::optional<std::chrono::milliseconds> timeout) {
  // Nothing to wait for (a synchronous collective, an operation already over): no clock to
  // read, and nothing to count. Only without a timeout of the caller's: is_completed() holds an
  // operation to its own deadline, which a longer explicit wait overrides.
  if (wait_depth > 0 || (!timeout && is_completed())) return wait_until_done(timeout);
  using Clock = std::chrono::steady_clock;
  struct Timed {
    Clock::time_point start = Clock::now();
    Timed() { ++wait_depth; }
    ~Timed() {
      --wait_depth;
      waited_ns.fetch_add(std::chrono::nanoseconds(Clock::now() - start).count(),
                          std::memory_order_relaxed);
    }
  } timed;
  wait_until_done(timeout);
}

std::chrono::nanoseconds communication_wait_time() {
  return std::chrono::nanoseconds(waited_ns.load(std::memory_order_relaxed));
}

namespace comm {
void exclude_thread_from_wait_time() { wait_depth = 1; }  // every wait is then "inside" one
}  // namespace comm

}  // namespace dtrain

namespace dtrain::comm {

PairWork::PairWork(std::shared_ptr<transport::Request> request, uint64_t flight)
    : request_(std::move(request)), flight_(flight) {
  if (flight_ != 0) {
    auto& recorder = FlightRecorder::global();
    recorder.set_seq(flight_, static_cast<uint32_t>(request_->seq));
    recorder.started(flight_);
  }
}

PairWork::~PairWork() { note_end(); }

void PairWork::note_end() {
  if (flight_ == 0) return;
  const bool done = request_->completion.done();
  FlightRecorder::global().ended(flight_, done && request_->completion.error() == nullptr);
  flight_ = 0;
}

bool PairWork::is_completed() {
  auto& r = *request_;
  if (r.completion.done()) {
    note_end();
    return true;
  }
  r.pair->try_progress();
  if (!r.completion.done() && r.deadline.expired()) {
    try {
      transport::wait_request(r,
                              r.deadline);  // cancels it with the timeout error; exception() has it
    } catch (const std::exception&) {
    }
  }
  if (!r.completion.done()) return false;
  note_end();
  return true;
}

void PairWork::wait_until_done(std::optional<std::chrono::milliseconds> timeout) {
  auto& r = *request_;
  try {
    transport::wait_request(r, timeout ? Deadline::after(*timeout) : r.deadline);
  } catch (...) {
    if (r.completion.done()) note_end();
    FlightRecorder::global().dump_on_failure(r.describe() + " failed");
    throw;
  }
  note_end();
}

}  // namespace dtrain::comm
