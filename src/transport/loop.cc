#include "transport/loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/log.h"
#include "dtrain/error.h"
#include "transport/pair.h"

namespace dtrain::transport {

Loop::Loop(std::function<void()> on_wake, std::function<void()> on_unpark)
    : on_wake_(std::move(on_wake)),
      on_unpark_(std::move(on_unpark)),
      epoll_(::epoll_create1(EPOLL_CLOEXEC)),
      wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (!epoll_.valid() || !wake_.valid())
    throw InternalError(fmt::format("cannot create the event loop: {}", std::strerror(errno)));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // null marks the wake-up fd
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev);
  thread_ = std::jthread([this](std::stop_token st) { run(st); });
}

Loop::~Loop() { stop(); }

void Loop::stop() {
  if (!thread_.joinable()) return;
  thread_.request_stop();
  wake();
  thread_.join();
}

void Loop::wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
}

void Loop::arm(Pair* pair, int fd, uint32_t events) {
  epoll_event ev{};
  ev.events = events | EPOLLONESHOT | EPOLLRDHUP;
  ev.data.ptr = pair;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev) != 0) {
    if (errno != ENOENT || ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0)
      DTRAIN_LOG_ERROR("event loop cannot watch socket {}: {}", fd, std::strerror(errno));
  }
}

void Loop::remove(int fd) { ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr); }

void Loop::run(std::stop_token stop) {
  epoll_event events[64];
  while (!stop.stop_requested()) {
    int n = ::epoll_wait(epoll_.get(), events, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      DTRAIN_LOG_ERROR("event loop stopped: epoll_wait failed: {}", std::strerror(errno));
      return;
    }
    for (int i = 0; i < n; ++i) {
      if (events[i].data.ptr == nullptr) {  // wake-up
        uint64_t count = 0;
        [[maybe_unused]] ssize_t r = ::read(wake_.get(), &count, sizeof(count));
        if (stop.stop_requested()) continue;
        if (unpark_requested_.exchange(false) && on_unpark_) on_unpark_();
        if (on_wake_) on_wake_();
        continue;
      }
      static_cast<Pair*>(events[i].data.ptr)->on_event(events[i].events);
    }
  }
}

}  // namespace dtrain::transport
