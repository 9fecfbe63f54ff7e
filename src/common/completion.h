// Completion: the one-shot "done, or failed with this error" flag an operation carries.
// Waiters first check the atomic state (cheap, lock-free), and only sleep on the condition
// variable when they have nothing better to do; completers only touch the mutex when someone
// sleeps.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>

#include "common/deadline.h"

namespace dtrain {

class Completion {
 public:
  bool done() const { return state_.load(std::memory_order_acquire) >= kSucceeded; }
  // The error after a failure; null after success or while pending.
  std::exception_ptr error() const { return done() ? error_ : nullptr; }

  // The first of succeed()/fail() wins; later calls return false and change nothing.
  bool succeed() {
    int expected = kPending;
    if (!state_.compare_exchange_strong(expected, kSucceeded)) return false;
    wake();
    return true;
  }
  bool fail(std::exception_ptr error) {
    int expected = kPending;
    if (!state_.compare_exchange_strong(expected, kClaimed)) return false;
    error_ = std::move(error);
    state_.store(kFailed, std::memory_order_release);
    wake();
    return true;
  }

  // Sleeps until done or `until`; returns done().
  bool wait_until(Clock::time_point until) {
    if (done()) return true;
    sleepers_.fetch_add(1);
    {
      std::unique_lock lock(mu_);
      cv_.wait_until(lock, until, [&] { return done(); });
    }
    sleepers_.fetch_sub(1);
    return done();
  }

 private:
  static constexpr int kPending = 0, kClaimed = 1, kSucceeded = 2, kFailed = 3;

  void wake() {
    if (sleepers_.load() > 0) {
      std::lock_guard lock(mu_);
      cv_.notify_all();
    }
  }

  std::atomic<int> state_{kPending};
  std::exception_ptr error_;  // written once, before state_ becomes kFailed
  std::atomic<int> sleepers_{0};
  std::mutex mu_;  // guards nothing but the sleep/wake handshake of cv_
  std::condition_variable cv_;
};

}  // namespace dtrain
