// The hang monitor's slow-rank check over beat pages written here as workers write theirs
// (comm::FlightBeat in DIR/rank<R>.beat): a rank that spends its windows outside calls while the
// others wait inside them is named; a rank whose process changed within a window (live recovery
// gave its place to a replacement or a spare, whose page counts from its own start) is not.
#include "launch/hang_monitor.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "comm/flight_recorder.h"

namespace dtrain::launch {
namespace {

using namespace std::chrono_literals;

class Beats {
 public:
  Beats() {
    char tmpl[] = "/tmp/hang-monitor-test-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  ~Beats() { std::filesystem::remove_all(dir_); }
  const std::string& dir() const { return dir_; }

  // Rank `rank`'s page, as process `pid` has it: `completed` calls ended, `inside_ms` in them.
  void write(int rank, int64_t pid, uint64_t completed, uint64_t inside_ms) const {
    comm::FlightBeat beat;
    beat.pid = pid;
    beat.rank = rank;
    beat.counters[0].recorded = completed;
    beat.counters[0].completed = completed;
    beat.counters[0].inside_ns = inside_ms * 1'000'000;
    const std::string path = fmt::format("{}/rank{}.beat", dir_, rank);
    const int fd = ::open((path + ".tmp").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, &beat, sizeof beat), static_cast<ssize_t>(sizeof beat));
    ::close(fd);
    std::filesystem::rename(path + ".tmp", path);
  }

 private:
  std::string dir_;
};

std::string drain(int fd) {
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  return text;
}

// Three ranks for `windows` windows of a second (a rank is named when it spends at least half a
// second more outside calls than the median): ranks 0 and 2 inside calls all the time, rank 1 as
// `rank1` says at each turn (its pid and inside time), all completing calls.
template <typename Rank1>
std::string watch(int windows, Rank1 rank1) {
  Beats beats;
  int fds[2];
  EXPECT_EQ(::pipe2(fds, O_NONBLOCK | O_CLOEXEC), 0);
  // Time inside calls follows the clock, not the turns: a loaded machine's late turns change
  // nothing.
  const auto start = std::chrono::steady_clock::now();
  auto elapsed_ms = [&] {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::steady_clock::now() - start)
                                     .count());
  };
  uint64_t completed = 1, inside_ms = 0;
  beats.write(0, 100, completed, inside_ms);
  beats.write(2, 102, completed, inside_ms);
  const auto [pid, inside] = rank1(inside_ms);
  beats.write(1, pid, completed, inside);
  {
    HangMonitor monitor(
        {.dir = beats.dir(), .hang = 0ms, .poll = 20ms, .slow_window = 1000ms, .out_fd = fds[1]});
    const int polls = windows * 1000 / 50;
    for (int i = 0; i < polls; ++i) {
      std::this_thread::sleep_for(50ms);
      ++completed;
      inside_ms = elapsed_ms();
      beats.write(0, 100, completed, inside_ms);
      beats.write(2, 102, completed, inside_ms);
      const auto [p, in] = rank1(inside_ms);
      beats.write(1, p, completed, in);
    }
  }
  const std::string text = drain(fds[0]);
  ::close(fds[0]);
  ::close(fds[1]);
  return text;
}

TEST(HangMonitor, NamesARankThatSpendsItsTimeOutsideCallsWhileTheOthersWait) {
  // Rank 1 is inside calls a fifth of the time the others are.
  const std::string text = watch(3, [](uint64_t inside_ms) {
    return std::pair<int64_t, uint64_t>{101, inside_ms / 5};
  });
  EXPECT_NE(text.find("dtrain run: rank 1 is slow: "), std::string::npos) << text;
}

TEST(HangMonitor, DoesNotNameARankWhoseProcessChangedWithinTheWindow) {
  // Rank 1 keeps pace with the others, but halfway its process is replaced: the new page counts
  // the new process's time inside calls from zero.
  const std::string text = watch(3, [](uint64_t inside_ms) {
    const uint64_t at_replacement = 1500;  // ms into the run
    if (inside_ms <= at_replacement) return std::pair<int64_t, uint64_t>{101, inside_ms};
    return std::pair<int64_t, uint64_t>{201, inside_ms - at_replacement};
  });
  EXPECT_EQ(text.find("is slow"), std::string::npos) << text;
}

}  // namespace
}  // namespace dtrain::launch
