// InterruptibleWait: a SIGINT handler chained in front of Python's, an eventfd, and a thread
// that aborts the groups being waited on (see interrupt.h).
#include "python/interrupt.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <thread>
#include <unordered_set>

#include <fmt/format.h>
#include <pybind11/pybind11.h>

#include "dtrain/process_group.h"

namespace dtrain::python {

struct InterruptibleWait::Entry {
  std::shared_ptr<ProcessGroup> group;
  std::string what;
  std::atomic<bool> interrupted{false};
};

namespace {

struct Watcher {
  std::mutex mutex;
  std::unordered_set<std::shared_ptr<InterruptibleWait::Entry>> waiting;
  int fd = -1;
  struct sigaction previous {};
  std::atomic<int> count{0};
};

// Never destroyed: the signal handler and the thread may run until the process ends.
Watcher* watcher_or_null = nullptr;
std::once_flag installed;

void on_sigint(int sig, siginfo_t* info, void* context) {
  Watcher* w = watcher_or_null;
  if (w == nullptr) return;
  if (w->count.load() > 0) {
    const int saved = errno;
    uint64_t one = 1;
    ssize_t ignored = write(w->fd, &one, sizeof one);  // async-signal-safe
    (void)ignored;
    errno = saved;
  }
  // Then Python's own handler (it sets the flag that raises KeyboardInterrupt).
  if (w->previous.sa_flags & SA_SIGINFO) {
    if (w->previous.sa_sigaction != nullptr) w->previous.sa_sigaction(sig, info, context);
  } else if (w->previous.sa_handler != SIG_IGN && w->previous.sa_handler != SIG_DFL &&
             w->previous.sa_handler != nullptr) {
    w->previous.sa_handler(sig);
  } else if (w->previous.sa_handler == SIG_DFL) {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

void watch(Watcher* w) {
  for (;;) {
    uint64_t n = 0;
    if (read(w->fd, &n, sizeof n) != sizeof n) {
      if (errno == EINTR) continue;
      return;
    }
    std::lock_guard lock(w->mutex);
    for (const auto& e : w->waiting) {
      e->interrupted = true;
      e->group->abort(fmt::format("interrupted by SIGINT (Ctrl-C) while waiting for {}", e->what));
    }
  }
}

Watcher* watcher() {
  std::call_once(installed, [] {
    auto* w = new Watcher;
    w->fd = eventfd(0, EFD_CLOEXEC);
    if (w->fd < 0) return;  // no Ctrl-C for blocking calls; everything else works
    struct sigaction action {};
    action.sa_sigaction = on_sigint;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGINT, nullptr, &w->previous) != 0) return;
    watcher_or_null = w;
    std::thread(watch, w).detach();
    sigaction(SIGINT, &action, nullptr);
  });
  return watcher_or_null;
}

}  // namespace

InterruptibleWait::InterruptibleWait(std::shared_ptr<ProcessGroup> group, std::string what)
    : entry_(std::make_shared<Entry>()) {
  entry_->group = std::move(group);
  entry_->what = std::move(what);
  if (Watcher* w = watcher()) {
    std::lock_guard lock(w->mutex);
    w->waiting.insert(entry_);
    ++w->count;
  }
}

InterruptibleWait::~InterruptibleWait() {
  if (Watcher* w = watcher_or_null) {
    std::lock_guard lock(w->mutex);
    if (w->waiting.erase(entry_) > 0) --w->count;
  }
}

bool InterruptibleWait::interrupted() const { return entry_->interrupted.load(); }

void InterruptibleWait::raise_if_interrupted() const {
  if (!interrupted()) return;
  if (PyErr_CheckSignals() != 0) {
    if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
      PyErr_Clear();
      PyErr_SetString(PyExc_KeyboardInterrupt,
                      fmt::format("rank {}: interrupted by Ctrl-C while waiting for {}; the "
                                  "group is aborted",
                                  entry_->group->rank(), entry_->what)
                          .c_str());
    }
    throw pybind11::error_already_set();
  }
}

}  // namespace dtrain::python
