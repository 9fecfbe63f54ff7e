// Turns SIGTERM and SIGINT into a call on a thread of its own, so that a service can stop cleanly
// (finish a reply, write a last checkpoint) instead of dying mid-way. Construct it before starting
// other threads: they inherit the blocked mask, so the signals reach only the watcher.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <functional>
#include <thread>

namespace dtrain {

class SignalWatcher {
 public:
  explicit SignalWatcher(std::function<void(int signal)> on_signal) {
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGUSR1);  // wakes the watcher when it is destroyed
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
    thread_ = std::thread([this, on_signal = std::move(on_signal)] {
      int sig = 0;
      while (sigwait(&set_, &sig) != 0) {
      }
      if (!quitting_ && sig != SIGUSR1) on_signal(sig);
    });
  }
  ~SignalWatcher() {
    quitting_ = true;
    pthread_kill(thread_.native_handle(), SIGUSR1);
    thread_.join();
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

 private:
  sigset_t set_, old_;
  std::atomic<bool> quitting_{false};
  std::thread thread_;
};

}  // namespace dtrain
