// core_pingpong: how long one cache line takes to go from one CPU to another and back, printed
// every 300 ms. Every shared-memory transfer between two ranks (dtrain's rings, OpenMPI's) is
// made of such trips, so this is the floor under them; on a virtual machine it shows when the
// hypervisor has put the two CPUs where they no longer share a cache (docs/performance.md, "Why
// shared memory is bimodal").
//   core_pingpong [seconds=20] [cpu_a=0] [cpu_b=1]
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace {

alignas(64) std::atomic<int> line{0};

bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int seconds = argc > 1 ? std::atoi(argv[1]) : 20;
  const int cpu_a = argc > 2 ? std::atoi(argv[2]) : 0;
  const int cpu_b = argc > 3 ? std::atoi(argv[3]) : 1;
  std::atomic<bool> stop{false};
  std::atomic<bool> pinned{true};
  // The echo: answers every odd value with the next even one.
  std::thread echo([&] {
    pinned = pin(cpu_b);
    while (!stop.load(std::memory_order_relaxed)) {
      const int v = line.load(std::memory_order_acquire);
      if (v & 1) line.store(v + 1, std::memory_order_release);
    }
  });
  if (!pin(cpu_a) || !pinned) {
    stop = true;
    echo.join();
    std::fprintf(stderr, "core_pingpong: cannot pin to CPUs %d and %d\n", cpu_a, cpu_b);
    return 1;
  }
  std::printf("round trip of a cache line between CPU %d and CPU %d, ns, every 300 ms:\n", cpu_a,
              cpu_b);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    constexpr int kTrips = 200'000;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kTrips; ++i) {
      const int v = line.load(std::memory_order_relaxed) + 1;  // even: the echo answered
      line.store(v, std::memory_order_release);
      while (line.load(std::memory_order_acquire) == v) {
      }
    }
    const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - t0;
    std::printf("%.0f ", took.count() / kTrips);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  std::printf("\n");
  stop = true;
  echo.join();
  return 0;
}
