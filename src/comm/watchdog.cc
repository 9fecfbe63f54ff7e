#include "comm/watchdog.h"

#include <algorithm>
#include <ctime>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/postmortem.h"
#include "common/log.h"

namespace dtrain::comm {
namespace {

std::string clock_text(int64_t ms_since_epoch) {
  std::time_t t = static_cast<std::time_t>(ms_since_epoch / 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  return fmt::format("{:02}:{:02}:{:02}.{:03}", tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ms_since_epoch % 1000);
}

}  // namespace

Watchdog::Watchdog(Store& store, std::string group, int rank, int size,
                   std::chrono::milliseconds threshold)
    : store_(store), group_(std::move(group)), rank_(rank), size_(size), threshold_(threshold) {
  if (size_ > 1 && threshold_.count() > 0)
    thread_ = std::jthread([this](std::stop_token st) { run(st); });
}

Watchdog::~Watchdog() {
  if (thread_.joinable()) {
    thread_.request_stop();
    cv_.notify_all();
  }
}

void Watchdog::enter(uint32_t seq, const CollectiveCall& call, const Deadline& deadline) {
  constexpr auto r = std::memory_order_relaxed;
  seq_.store(0, r);
  std::atomic_thread_fence(std::memory_order_release);
  head_.store(call.head(), r);
  count_.store(call.count, r);
  limit_ms_.store(deadline.limit().count(), r);
  since_ns_.store(deadline.start().time_since_epoch().count(), r);
  seq_.store(seq, std::memory_order_release);
}

void Watchdog::leave() { seq_.store(0, std::memory_order_release); }

Watchdog::Running Watchdog::running() const {
  constexpr auto r = std::memory_order_relaxed;
  Running run;
  run.seq = seq_.load(std::memory_order_acquire);
  if (run.seq == 0) return run;
  run.call = CollectiveCall::from_head(head_.load(r), count_.load(r));
  run.limit = std::chrono::milliseconds(limit_ms_.load(r));
  run.since =
      std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(since_ns_.load(r)));
  std::atomic_thread_fence(std::memory_order_acquire);
  if (seq_.load(r) != run.seq) run.seq = 0;  // it ended (or another began) while read
  return run;
}

int64_t Watchdog::arrived_ms() const {
  return arrived_ms(std::chrono::steady_clock::time_point(
      std::chrono::steady_clock::duration(since_ns_.load(std::memory_order_relaxed))));
}

int64_t Watchdog::arrived_ms(std::chrono::steady_clock::time_point since) {
  // Wall-clock time of the arrival, derived when asked: enter() reads no clock.
  const auto arrived = std::chrono::system_clock::now() -
                       std::chrono::duration_cast<std::chrono::system_clock::duration>(
                           std::chrono::steady_clock::now() - since);
  return std::chrono::duration_cast<std::chrono::milliseconds>(arrived.time_since_epoch()).count();
}

void Watchdog::publish_arrival(uint32_t seq) { publish(seq, arrived_ms()); }

void Watchdog::publish_call(uint32_t seq) {
  publish(seq, std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count());
}

void Watchdog::publish_called(uint32_t seq) {
  const Running run = running();  // read as one collective's fields, on another thread
  if (run.seq == seq)
    publish(seq, arrived_ms(run.since));
  else
    publish_call(seq);
}

Watchdog::Arrivals Watchdog::read_arrivals(uint32_t seq) {
  const int64_t mine = arrived_ms();
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  std::vector<std::string> arrived;
  std::vector<int> absent;
  Arrivals a;
  publish(seq, mine);
  try {
    for (int r = 0; r < size_; ++r) {
      const std::string key = fmt::format("{}/arrive/{}/{}", group_, seq, r);
      if (!store_.check({key})) {
        a.not_arrived.push_back(r);
        // A rank that made a post-mortem statement on this collective has said what it did
        // (called it, or not yet): "not arrived" beside that would contradict or repeat it.
        if (!store_.check({postmortem_key(group_, seq, r)})) absent.push_back(r);
        continue;
      }
      int64_t at = std::stoll(store_.get_string(key));
      arrived.push_back(
          fmt::format("rank {} at {} (waiting {:.1f} s)", r, clock_text(at), (now - at) / 1000.0));
    }
  } catch (const std::exception& e) {
    return {.text = fmt::format("(arrivals unknown: the store is unreachable: {})", e.what()),
            .lowest_waiting = true};
  }
  a.text = fmt::format("arrived: {}", fmt::join(arrived, ", "));
  if (!absent.empty())
    a.text += fmt::format("; not arrived: {} {}", absent.size() == 1 ? "rank" : "ranks",
                          fmt::join(absent, ", "));
  a.lowest_waiting =
      std::count_if(absent.begin(), absent.end(), [&](int r) { return r < rank_; }) == rank_;
  return a;
}

void Watchdog::publish(uint32_t seq, int64_t arrived_ms) {
  try {
    store_.set(fmt::format("{}/arrive/{}/{}", group_, seq, rank_), std::to_string(arrived_ms));
  } catch (const std::exception&) {
    // The store may be gone; arrivals() says so when it reads.
  }
}

void Watchdog::report(uint32_t seq, const std::string& what,
                      std::chrono::steady_clock::duration waited, std::chrono::milliseconds limit) {
  const Arrivals a = read_arrivals(seq);
  const std::string of_limit = limit == std::chrono::milliseconds::max()
                                   ? std::string("(no limit)")
                                   : fmt::format("of its {:g} s limit", limit.count() / 1000.0);
  const std::string text =
      fmt::format("rank {}: collective #{} of group {}, {}, has waited {:.1f} s {}: {}", rank_, seq,
                  group_, what, std::chrono::duration<double>(waited).count(), of_limit, a.text);
  if (a.lowest_waiting) {
    DTRAIN_LOG_INFO("{}", text);
  } else {
    DTRAIN_LOG_DEBUG("{}", text);
  }
}

void Watchdog::run(std::stop_token stop) {
  using Clock = std::chrono::steady_clock;
  // Idle (or before a collective's first deadline is known), look in at this pace; otherwise
  // wake at the next thing due, so that reports come at the threshold and its multiples.
  const auto idle = std::chrono::milliseconds(std::min<int64_t>(threshold_.count() / 4 + 1, 1000));
  std::unique_lock lock(mu_);
  while (!stop.stop_requested()) {
    Clock::time_point wake = Clock::now() + idle;
    Running run = running();
    if (run.seq != 0 && run.seq != watched_) {  // a collective began since the last look
      watched_ = run.seq;
      next_report_ = threshold_;
    }
    if (run.seq != 0)
      wake = std::min(wake, run.since + (published_ != run.seq ? threshold_ / 2 : next_report_));
    cv_.wait_until(lock, stop, wake, [] { return false; });
    if (stop.stop_requested()) continue;
    run = running();
    if (run.seq == 0 || run.seq != watched_) continue;
    const auto waited = Clock::now() - run.since;
    // Every rank stuck this long says when it arrived, well before anyone reports, so that the
    // report finds every waiting rank's entry.
    if (waited >= threshold_ / 2 && published_ != run.seq) {
      published_ = run.seq;
      lock.unlock();
      publish(run.seq, arrived_ms());
      lock.lock();
      continue;
    }
    if (waited < next_report_) continue;
    // Past its limit the call is failing, and its error says all this and more: nothing more
    // is due for it.
    if (run.limit != std::chrono::milliseconds::max() && waited >= run.limit) {
      next_report_ = Clock::duration::max() / 2;
      continue;
    }
    while (next_report_ <= waited) next_report_ += threshold_;  // 4, 8, 12 s: no drift
    lock.unlock();
    report(run.seq, run.call.describe(), waited, run.limit);
    lock.lock();
  }
}

}  // namespace dtrain::comm
