// Loop: one epoll thread per device that moves bytes for pairs nobody is busy-polling, and so
// notices a dead peer even when no operation is waiting on it. Sockets are registered one-shot:
// after an event the pair decides whether to re-arm (not while a waiter spins on it).
#pragma once

#include <cstdint>
#include <functional>
#include <thread>

#include "common/socket.h"

namespace dtrain::transport::tcp {

class Pair;

class Loop {
 public:
  // on_wake runs on the loop thread after every wake() (and never after stop()).
  explicit Loop(std::function<void()> on_wake = {});
  ~Loop();  // stops and joins the thread
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  // Registers (or re-arms) fd for `events` (EPOLLIN/EPOLLOUT), one-shot; events go to pair.
  void arm(Pair* pair, int fd, uint32_t events);
  void remove(int fd);
  void stop();
  void wake();

 private:
  void run(std::stop_token stop);

  std::function<void()> on_wake_;
  net::Fd epoll_;
  net::Fd wake_;  // eventfd that interrupts epoll_wait on stop()
  std::jthread thread_;
};

}  // namespace dtrain::transport::tcp
