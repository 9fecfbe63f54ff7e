#include "transport/wait.h"

#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <vector>

#include <fmt/format.h>

#include "common/thread_clock.h"

namespace dtrain::transport {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

void futex_wait(std::atomic<uint32_t>& word, uint32_t seen, std::chrono::nanoseconds limit) {
  if (limit.count() <= 0) return;
  timespec ts{static_cast<time_t>(limit.count() / 1'000'000'000),
              static_cast<long>(limit.count() % 1'000'000'000)};
  // Shared between processes: not FUTEX_PRIVATE.
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

// Sleeps until one of the words differs from what was seen in it, one is woken, or `limit`
// passes. False when the kernel has no futex_waitv (Linux < 5.16).
bool futex_wait_any(std::span<futex_waitv> words, std::chrono::nanoseconds limit) {
  if (limit.count() <= 0) return true;
  timespec at{};
  ::clock_gettime(CLOCK_MONOTONIC, &at);  // futex_waitv takes an absolute time
  const int64_t ns = at.tv_nsec + limit.count() % 1'000'000'000;
  at.tv_sec += static_cast<time_t>(limit.count() / 1'000'000'000 + ns / 1'000'000'000);
  at.tv_nsec = static_cast<long>(ns % 1'000'000'000);
  const long r = ::syscall(SYS_futex_waitv, words.data(), static_cast<unsigned>(words.size()), 0,
                           &at, CLOCK_MONOTONIC);
  return !(r < 0 && errno == ENOSYS);
}

// Set once a futex_waitv failed with ENOSYS: waits on several bells go to the event loop.
std::atomic<bool> no_waitv{false};

bool all_done(std::span<Request* const> requests) {
  for (Request* r : requests)
    if (!r->completion.done()) return false;
  return true;
}

}  // namespace

// How a waiting thread drives its pairs (the part of Pair private to waiting: Pair befriends
// this class).
class Waiter {
 public:
  static void wait(std::span<Request* const> requests, std::span<Pair* const> pairs,
                   const Deadline& deadline, bool spinning);

 private:
  // What a waiter sleeps on: the pairs' sockets, their bells, or (the event loop moving the
  // bytes) the requests.
  enum class SleepOn { kSockets, kBells, kRequests };
  static bool spin(std::span<Request* const> requests, std::span<Pair* const> pairs,
                   const Deadline& deadline);
  static bool sleep(SleepOn how, std::span<Request* const> requests, std::span<Pair* const> watched,
                    const Deadline& deadline);
};

// Busy-polls the pairs until the requests finish (true) or the spin budget runs out.
bool Waiter::spin(std::span<Request* const> requests, std::span<Pair* const> pairs,
                  const Deadline& deadline) {
  const auto budget = pairs[0]->spin();
  const bool oversubscribed = pairs[0]->oversubscribed();
  // Spin, then yield, then sleep: lowest latency when the peers are quick, and no lost cores
  // when processes outnumber them.
  // The budget counts from the last byte moved: a long transfer never falls asleep midway.
  // The clock is read every few polls: a poll is cheaper than reading it, and a pause
  // (about 25 ns on AMD, up to 140 ns on Intel) is the latency added when data lands.
  // The budget's clock starts at the first look at it: a wait the first poll ends reads none.
  Clock::time_point spin_end{};
  bool yielding = oversubscribed;
  for (uint32_t polls = 1;; ++polls) {
    bool moved = false;
    for (Pair* p : pairs) moved |= p->try_progress();
    if (all_done(requests)) return true;
    if (moved || yielding || (polls & 15) == 0) {
      auto now = thread_clock::now();
      if (moved || spin_end == Clock::time_point{}) spin_end = now + budget;
      if (now >= spin_end + budget || now >= deadline.at()) return false;
      // More ranks than cores, or a long wait: give the core to whoever has data to send.
      yielding = now >= spin_end || oversubscribed;
    }
    // A yield now and then even when cores are plenty: should the peer's thread share this
    // core after all (the scheduler put both there), it runs within microseconds instead of
    // after the whole spin budget. With nothing else to run, a yield returns at once.
    if (yielding || (polls & 63) == 0)
      sched_yield();
    else
      cpu_relax();
  }
}

// Sleeps on `how` until the requests finish or the deadline passes, moving `watched`'s bytes on
// every wake-up. False when the kernel cannot wait on several bells: nothing was waited.
bool Waiter::sleep(SleepOn how, std::span<Request* const> requests, std::span<Pair* const> watched,
                   const Deadline& deadline) {
  if (how == SleepOn::kBells && watched.size() > 1 &&
      (watched.size() > FUTEX_WAITV_MAX || no_waitv.load()))
    return false;
  // Enter: the sleeping thread is the one the bells wake; or the event loop is asked for the
  // requests' pairs (a socket poller holds them out of it, as while spinning: see the caller).
  for (Pair* p : watched) {
    if (how == SleepOn::kBells) p->begin_bell_sleep();
    if (how == SleepOn::kRequests) p->block_begin();
  }
  std::vector<pollfd> fds;
  std::vector<futex_waitv> words;
  bool supported = true;
  for (;;) {
    // Note what the sleep waits for, then look: what comes after the look wakes the sleep.
    if (how == SleepOn::kSockets) {
      // Every pair held out of the event loop is watched, not only those of the requests
      // waited on: a ring's sends to the right must keep flowing while it waits on the left.
      // (poll() is level-triggered: looking first loses nothing.)
      for (Pair* p : watched) p->try_progress();
      fds.clear();
      for (Pair* p : watched)
        fds.push_back({p->sleep_on().fd,
                       static_cast<short>(POLLIN | (p->wants_to_write() ? POLLOUT : 0)), 0});
    } else if (how == SleepOn::kBells) {
      words.clear();
      for (Pair* p : watched) {
        auto* bell = p->sleep_on().bell;
        words.push_back({.val = bell->load(std::memory_order_acquire),
                         .uaddr = reinterpret_cast<uintptr_t>(bell),
                         .flags = FUTEX_32,  // shared between processes: not FUTEX_PRIVATE_FLAG
                         .__reserved = 0});
      }
      for (Pair* p : watched) p->look_before_sleep();
    }
    if (all_done(requests) || deadline.expired()) break;
    // Bounded slices: the clock arithmetic of a "never" deadline, and a backstop.
    const auto slice =
        std::min(deadline.remaining(), how == SleepOn::kRequests ? std::chrono::milliseconds(1000)
                                                                 : std::chrono::milliseconds(100));
    if (how == SleepOn::kSockets) {
      ::poll(fds.data(), fds.size(), static_cast<int>(slice.count()));
    } else if (how == SleepOn::kBells) {
      if (watched.size() == 1) {
        futex_wait(*reinterpret_cast<std::atomic<uint32_t>*>(words[0].uaddr),
                   static_cast<uint32_t>(words[0].val), slice);
      } else if (!futex_wait_any(words, slice)) {
        no_waitv.store(true);
        supported = false;
        break;
      }
    } else {
      for (Request* r : requests)
        if (!r->completion.done()) {
          r->completion.wait_until(Clock::now() + slice);
          break;
        }
    }
  }
  for (Pair* p : watched) {
    if (how == SleepOn::kBells) p->end_bell_sleep();
    if (how == SleepOn::kRequests) p->block_end();
  }
  return supported;
}

void wait_requests(std::span<Request* const> requests, std::span<Pair* const> pairs,
                   const Deadline& deadline, bool spinning) {
  Waiter::wait(requests, pairs, deadline, spinning);
}

void wait_request(Request& request, const Deadline& deadline) {
  Request* requests[] = {&request};
  Pair* pairs[] = {request.pair.get()};
  Waiter::wait(requests, pairs, deadline, /*spinning=*/false);
}

void Waiter::wait(std::span<Request* const> requests, std::span<Pair* const> pairs,
                  const Deadline& deadline, bool spinning) {
  if (!all_done(requests) && !pairs.empty() && pairs[0]->spin().count() > 0) {
    // While spinning, the pairs stay out of the event loop.
    if (!spinning)
      for (Pair* p : pairs) p->begin_spin();
    spin(requests, pairs, deadline);
    if (!spinning)
      for (Pair* p : pairs) p->end_spin();
  }
  if (!all_done(requests)) {
    // About to sleep: idle pairs that left the loop (end_spin) go back to it, so that what they
    // carry moves meanwhile (early bytes a peer waits to be rid of, a peer's failure notice).
    for (Pair* p : pairs) p->unpark_idle_pairs();
    // Ask the streams what they sleep on. The one pair every unfinished request waits on, if
    // there is one, is enough to watch when it sleeps on a bell.
    Pair* only = nullptr;
    for (Request* r : requests) {
      if (r->completion.done()) continue;
      if (only == nullptr) only = r->pair.get();
      if (only != r->pair.get()) {
        only = nullptr;
        break;
      }
    }
    bool sockets = !pairs.empty(), bells = !pairs.empty();
    for (Pair* p : pairs) {
      const Pair::SleepOn on = p->sleep_on();
      sockets &= on.bell == nullptr;
      bells &= on.bell != nullptr;
    }
    SleepOn how = SleepOn::kRequests;
    std::span<Pair* const> watched = pairs;
    if (sockets) {
      how = SleepOn::kSockets;
    } else if (only != nullptr && only->sleep_on().bell != nullptr) {
      how = SleepOn::kBells;
      watched = std::span(&only, 1);
    } else if (bells) {
      how = SleepOn::kBells;
    }
    // A thread polling the sockets moves the bytes itself: the pairs stay out of the event
    // loop as while spinning (one wake-up, not two). Otherwise they are handed back to it.
    const bool held = how == SleepOn::kSockets;
    if (held != spinning)
      for (Pair* p : pairs) held ? p->begin_spin() : p->end_spin();
    if (!sleep(how, requests, watched, deadline))
      sleep(SleepOn::kRequests, requests, pairs, deadline);
    thread_clock::now();  // what follows a sleep is dated after it (common/thread_clock.h)
    if (held != spinning)
      for (Pair* p : pairs) held ? p->end_spin() : p->begin_spin();
  }
  for (Request* r : requests)
    if (!r->completion.done())
      r->pair->cancel(*r, fmt::format("timed out after {}", deadline.describe()));
  for (Request* r : requests)
    if (auto e = r->completion.error()) std::rethrow_exception(e);
}

}  // namespace dtrain::transport
