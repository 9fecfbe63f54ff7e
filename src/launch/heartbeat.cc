#include "launch/heartbeat.h"

#include <optional>

#include "common/log.h"
#include "dtrain/error.h"

namespace dtrain::launch {

using Clock = std::chrono::steady_clock;

Heartbeat::Heartbeat(std::shared_ptr<Store> store, Connect connect, HeartbeatOptions options)
    : connect_(std::move(connect)), options_(std::move(options)), store_(std::move(store)) {
  thread_ = std::jthread([this](std::stop_token stop) { run(stop); });
}

Heartbeat::~Heartbeat() { stop(); }

void Heartbeat::stop() {
  if (!thread_.joinable()) return;
  thread_.request_stop();
  cv_.notify_all();
  thread_.join();
}

void Heartbeat::run(std::stop_token stop) {
  std::optional<Clock::time_point> failing_since;  // the first failed beat of an outage
  std::string last_error;
  while (!stop.stop_requested()) {
    try {
      if (!store_) store_ = connect_();
      store_->add(options_.key, 1);
      if (failing_since) {
        DTRAIN_LOG_WARN(
            "{}: heartbeat resumed after {:.1f} s without one going through (the last failure: {})",
            options_.log_prefix,
            std::chrono::duration<double>(Clock::now() - *failing_since).count(), last_error);
        failing_since.reset();
      }
    } catch (const Error& e) {
      // The connection is unusable after a failed call (the stream may be out of step): the
      // next beat goes through a new one. A store that is really gone, the main thread meets
      // on its own calls.
      store_.reset();
      last_error = e.what();
      if (!failing_since) {
        failing_since = Clock::now();
        DTRAIN_LOG_WARN(
            "{}: a heartbeat did not go through, reconnecting to the store every "
            "{} ms: {}",
            options_.log_prefix, options_.interval.count(), e.what());
      }
    }
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, stop, options_.interval, [] { return false; });
  }
}

}  // namespace dtrain::launch
