// A point in time by which a wait must end, remembering when it started and its limit so that
// timeout errors can say "after 30.0 s of a 30 s limit".
#pragma once

#include <algorithm>
#include <chrono>
#include <string>

#include <fmt/format.h>

namespace dtrain {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  static Deadline after(std::chrono::milliseconds limit) { return Deadline(Clock::now(), limit); }
  static Deadline never() { return Deadline(Clock::now(), std::chrono::milliseconds::max()); }

  bool is_never() const { return limit_ == std::chrono::milliseconds::max(); }
  bool expired() const { return !is_never() && Clock::now() >= start_ + limit_; }
  std::chrono::milliseconds limit() const { return limit_; }
  Clock::time_point start() const { return start_; }
  Clock::time_point at() const { return is_never() ? Clock::time_point::max() : start_ + limit_; }
  std::chrono::milliseconds elapsed() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start_);
  }
  std::chrono::milliseconds remaining() const {
    if (is_never()) return limit_;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at() - Clock::now());
    return std::max(left, std::chrono::milliseconds(0));
  }
  // Milliseconds for poll(2): -1 for never, otherwise the remaining time rounded up.
  int poll_ms() const {
    if (is_never()) return -1;
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(at() - Clock::now());
    if (left.count() <= 0) return 0;
    return static_cast<int>(std::min<int64_t>((left.count() + 999) / 1000, 1 << 30));
  }
  // "12.0 s of a 30 s limit"
  std::string describe() const {
    if (is_never()) return fmt::format("{:.1f} s (no limit)", elapsed().count() / 1000.0);
    // As precise as the limit: "0.051 s of a 0.05 s limit", not "0.1 s".
    const double elapsed_s = elapsed().count() / 1000.0;
    return limit_.count() < 1000
               ? fmt::format("{:.3f} s of a {:g} s limit", elapsed_s, limit_.count() / 1000.0)
               : fmt::format("{:.1f} s of a {:g} s limit", elapsed_s, limit_.count() / 1000.0);
  }

 private:
  Deadline(Clock::time_point start, std::chrono::milliseconds limit)
      : start_(start), limit_(limit) {}
  Clock::time_point start_;
  std::chrono::milliseconds limit_;
};

}  // namespace dtrain
