// Loop: one epoll thread per device that moves bytes for pairs nobody is busy-polling, and so
// notices a dead peer even when no operation is waiting on it. Sockets are registered one-shot:
// after an event the pair decides whether to re-arm (not while a waiter spins on it).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>

#include "common/socket.h"

namespace dtrain::transport {

class Pair;

class Loop {
 public:
  // on_wake runs on the loop thread after every wake() (and never after stop()); on_unpark
  // after a wake() that unpark() asked for.
  explicit Loop(std::function<void()> on_wake = {}, std::function<void()> on_unpark = {});
  ~Loop();  // stops and joins the thread
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  // Registers (or re-arms) fd for `events` (EPOLLIN/EPOLLOUT), one-shot; events go to pair.
  void arm(Pair* pair, int fd, uint32_t events);
  // A pair left itself out of the loop while idle (Pair::end_spin).
  void parked() { parked_.fetch_add(1, std::memory_order_relaxed); }
  // A thread is about to sleep on this loop's pairs: if any pair is parked, the loop thread
  // hands them all back to the loop (on_unpark), so that whatever they carry (early bytes a
  // peer waits to get rid of, a peer's failure notice) moves while everyone waits.
  void unpark() {
    if (parked_.load(std::memory_order_relaxed) == 0 || parked_.exchange(0) == 0) return;
    unpark_requested_.store(true);
    wake();
  }
  void remove(int fd);
  void stop();
  void wake();

 private:
  void run(std::stop_token stop);

  std::function<void()> on_wake_;
  std::function<void()> on_unpark_;
  std::atomic<int> parked_{0};  // pairs parked since the last unpark (an upper bound)
  std::atomic<bool> unpark_requested_{false};
  net::Fd epoll_;
  net::Fd wake_;  // eventfd that interrupts epoll_wait on stop()
  std::jthread thread_;
};

}  // namespace dtrain::transport
