// flight_recorder_bench: what recording one call and its end costs the calling thread, alone
// (no collective around it), the recorder's way: a collective's record with the enqueue time
// its caller already read, then its end. bench/flight_recorder_cost.sh measures the same on an
// 8-byte all-reduce (docs/performance.md, "The flight recorder's cost").
//   flight_recorder_bench [calls=10000000] [rounds=5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "comm/flight_recorder.h"

int main(int argc, char** argv) {
  using Clock = std::chrono::steady_clock;
  const long calls = argc > 1 ? std::atol(argv[1]) : 10'000'000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  auto& recorder = dtrain::comm::FlightRecorder::global();
  const uint16_t group = recorder.group_id("bench");
  dtrain::comm::CollectiveCall collective{.kind = dtrain::comm::CollectiveKind::kAllreduce,
                                          .dtype = dtrain::DType::kF32,
                                          .count = 2};
  const auto enqueued = Clock::now();
  std::vector<double> ns;
  for (int r = 0; r < rounds; ++r) {
    const auto start = Clock::now();
    for (long i = 0; i < calls; ++i) {
      // As a collective's submission makes it (process_group.cc).
      const uint64_t ticket = recorder.record({.kind = dtrain::comm::FlightCall::Kind::kCollective,
                                               .group = group,
                                               .seq = static_cast<uint32_t>(i),
                                               .call = collective,
                                               .algorithm = "ring",
                                               .caller = &collective,
                                               .enqueued = enqueued});
      recorder.ended(ticket, true);
    }
    ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - start).count() / calls);
    std::printf("round %d: %.1f ns a call\n", r + 1, ns.back());
  }
  std::sort(ns.begin(), ns.end());
  std::printf("record and end, median of %d rounds of %ld calls: %.1f ns (recorder %s)\n", rounds,
              calls, ns[ns.size() / 2], recorder.enabled() ? "on" : "off");
}
