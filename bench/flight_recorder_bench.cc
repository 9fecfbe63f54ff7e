// flight_recorder_bench: what the flight recorder costs (docs/performance.md, "The flight
// recorder's cost").
//
//   flight_recorder_bench [calls=10000000] [rounds=5]
//       recording one call and its end, alone (no collective around it), the recorder's two ways:
//       a native group's collective into its history (and the same muted: the history's entry
//       for the post-mortem alone), and any other call into its thread's ring, each with the
//       enqueue time its caller already read.
//   dtrain run -n 2 -- flight_recorder_bench allreduce [pairs=200] [calls=5000]
//       8-byte all-reduces of the world group, in blocks of `calls`, recorded and not (the group
//       muted) in turn, in the same processes: the VM's speed, which drifts from minute to
//       minute by more than the recorder costs, is shared by the two blocks of a pair. Rank 0
//       prints the medians and the median of the pairs' ratios.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

#include "comm/flight_recorder.h"
#include "dtrain/dtrain.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

int alone(long calls, int rounds) {
  auto& recorder = dtrain::comm::FlightRecorder::global();
  const uint16_t group = recorder.group_id("bench");
  const auto history = recorder.history(group);
  dtrain::comm::CollectiveCall collective{
      .kind = dtrain::comm::CollectiveKind::kAllreduce, .dtype = dtrain::DType::kF32, .count = 2};
  const auto enqueued = Clock::now();
  // Nanoseconds a call, median of the rounds.
  auto time = [&](const char* what, auto&& record_and_end) {
    std::vector<double> ns;
    for (int r = 0; r < rounds; ++r) {
      const auto start = Clock::now();
      for (long i = 1; i <= calls; ++i) record_and_end(static_cast<uint32_t>(i));
      ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - start).count() / calls);
    }
    std::printf("%s, median of %d rounds of %ld calls: %.1f ns (recorder %s)\n", what, rounds,
                calls, median(ns), recorder.enabled() ? "on" : "off");
  };
  // As a native group's submission records a collective (process_group.cc); muted, what the
  // group's history costs without the recorder (the post-mortem's entry alone).
  auto group_call = [&](uint32_t seq) {
    recorder.called(*history, group, seq, collective, "ring", &collective, enqueued);
    recorder.finished(*history, seq, true);
  };
  time("a group's collective, called and finished", group_call);
  recorder.mute(group);
  time("the same, the group muted", group_call);
  recorder.mute(group, false);
  // As the other backends record theirs (recorded_process_group.cc).
  time("a call into its thread's ring, recorded and ended", [&](uint32_t seq) {
    recorder.ended(recorder.record({.kind = dtrain::comm::FlightCall::Kind::kCollective,
                                    .group = group,
                                    .seq = seq,
                                    .call = collective,
                                    .algorithm = "ring",
                                    .caller = &collective,
                                    .enqueued = enqueued}),
                   true);
  });
  return 0;
}

int allreduce(int pairs, int calls) {
  auto pg = dtrain::init_process_group();
  auto& recorder = dtrain::comm::FlightRecorder::global();
  if (!recorder.enabled()) {
    std::fprintf(stderr, "flight_recorder_bench: the recorder is off (DTRAIN_FLIGHT_RECORDER)\n");
    return 2;
  }
  const uint16_t group = recorder.group_id(pg->name());
  std::vector<float> data(2, 1.0f);
  const auto view = dtrain::TensorView::of(data);
  const dtrain::AllreduceOptions options{.async_op = false};
  auto block = [&] {
    const auto start = Clock::now();
    for (int i = 0; i < calls; ++i) pg->allreduce(view, options)->wait();
    return std::chrono::duration<double, std::micro>(Clock::now() - start).count() / calls;
  };
  for (int i = 0; i < 4; ++i) block();  // warm up, recorded: the ring's lines are touched
  std::vector<double> on, off, ratios;
  for (int p = 0; p < pairs; ++p) {
    // Alternating which goes first cancels a trend within a pair. Every rank runs the same
    // schedule, so the blocks line up without a barrier.
    const bool on_first = p % 2 == 0;
    double us[2];
    for (int b = 0; b < 2; ++b) {
      const bool recorded = (b == 0) == on_first;
      recorder.mute(group, !recorded);
      us[recorded ? 0 : 1] = block();
    }
    on.push_back(us[0]);
    off.push_back(us[1]);
    ratios.push_back(us[0] / us[1]);
  }
  recorder.mute(group, false);
  if (pg->rank() == 0)
    std::printf(
        "8-byte all-reduce, %d ranks, %d pairs of blocks of %d calls: recorded %.3f us, not "
        "recorded %.3f us (medians); the pairs' ratios: median %+.2f%%, middle half %+.2f%% to "
        "%+.2f%%\n",
        pg->size(), pairs, calls, median(on), median(off), (median(ratios) - 1) * 100,
        (quantile(ratios, 0.25) - 1) * 100, (quantile(ratios, 0.75) - 1) * 100);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc > 1 && std::strcmp(argv[1], "allreduce") == 0)
    return allreduce(argc > 2 ? std::atoi(argv[2]) : 200, argc > 3 ? std::atoi(argv[3]) : 5000);
  return alone(argc > 1 ? std::atol(argv[1]) : 10'000'000, argc > 2 ? std::atoi(argv[2]) : 5);
} catch (const std::exception& e) {
  std::fprintf(stderr, "flight_recorder_bench: %s\n", e.what());
  return 1;
}
