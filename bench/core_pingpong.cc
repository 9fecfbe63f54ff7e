// core_pingpong: how long one cache line takes to go from one CPU to another and back, printed
// every 300 ms. Every shared-memory transfer between two ranks (dtrain's rings, OpenMPI's) is
// made of such trips, so this is the floor under them; on a virtual machine it shows when the
// hypervisor has put the two CPUs where they no longer share a cache (docs/performance.md, "Why
// shared memory is bimodal"). The trip is measured as `dtrain bench --bound` measures it
// (bench/machine_bound.h).
//   core_pingpong [seconds=20] [cpu_a=0] [cpu_b=1]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "bench/machine_bound.h"

int main(int argc, char** argv) {
  const int seconds = argc > 1 ? std::atoi(argv[1]) : 20;
  const int cpu_a = argc > 2 ? std::atoi(argv[2]) : 0;
  const int cpu_b = argc > 3 ? std::atoi(argv[3]) : 1;
  std::printf("round trip of a cache line between CPU %d and CPU %d, ns, every 300 ms:\n", cpu_a,
              cpu_b);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    const double ns = dtrain::bench::cache_line_round_trip_ns(cpu_a, cpu_b, 200'000);
    if (ns <= 0) {
      std::fprintf(stderr, "core_pingpong: cannot pin to CPUs %d and %d\n", cpu_a, cpu_b);
      return 1;
    }
    std::printf("%.0f ", ns);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  std::printf("\n");
  return 0;
}
