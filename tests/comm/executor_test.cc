// The executor's waits: a thread waiting for a collective the worker runs busy-polls for the
// configured time (DTRAIN_SPIN_US) and not at all when that is 0, which it once ignored.
#include "comm/executor.h"

#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <thread>

namespace dtrain::comm {
namespace {

using namespace std::chrono_literals;

double thread_cpu_ms() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// CPU milliseconds this thread spends waiting for `waits` collectives of 2 ms each that the
// worker has already started.
double cpu_of_waits(ExecutorOptions options, int waits) {
  auto executor = std::make_shared<Executor>([](std::exception_ptr) {}, options);
  executor->start();
  double cpu = 0;
  for (int i = 0; i < waits; ++i) {
    auto work = std::make_shared<CollectiveWork>([] { std::this_thread::sleep_for(2ms); },
                                                 Deadline::after(10s), "a 2 ms collective",
                                                 executor);
    executor->submit(work);
    std::this_thread::sleep_for(300us);  // the worker has it by now
    const double before = thread_cpu_ms();
    work->wait_until_done(std::nullopt);
    cpu += thread_cpu_ms() - before;
  }
  executor->shutdown(std::make_exception_ptr(std::runtime_error("test over")));
  return cpu;
}

TEST(Executor, AWaitSpinsAsLongAsConfiguredAndNeverWhenZero) {
  constexpr int kWaits = 300;
  // 300 waits of 200 us spinning each: 60 ms of CPU (allow for a busy machine's preemptions).
  const double spinning = cpu_of_waits({.spin = 200us}, kWaits);
  EXPECT_GT(spinning, 20.0) << "a 200 us spin burned only " << spinning << " ms in " << kWaits
                            << " waits";
  // Never spin: each wait goes to sleep at once (microseconds of system calls).
  const double sleeping = cpu_of_waits({.spin = 0us}, kWaits);
  EXPECT_LT(sleeping, spinning / 4) << "DTRAIN_SPIN_US=0 still burned " << sleeping << " ms";
}

}  // namespace
}  // namespace dtrain::comm
