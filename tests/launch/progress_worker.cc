// A worker for the metrics tests (metrics_test.cc runs it under `dtrain run --metrics-port`):
// each step "computes" for --compute-ms (rank 1 for --slow-ms more), all-reduces one value, and
// reports the step to its ProgressReporter with --batch samples. Rank 0 therefore waits about
// --slow-ms per step in the all-reduce: its communication; rank 1's step is nearly all compute.
//
//   progress_worker [--steps N] [--compute-ms MS] [--slow-ms MS] [--batch B] [--fail-at S]
//
// --fail-at S: rank 1 exits 3 at step S of the first attempt (DTRAIN_RESTART_COUNT 0), for the
// elastic agent to restart the job.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/dtrain.h"

int main(int argc, char** argv) {
  int steps = 100, compute_ms = 20, slow_ms = 30, batch = 32, fail_at = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::stoi(argv[i + 1]);
    if (flag == "--steps") steps = value;
    if (flag == "--compute-ms") compute_ms = value;
    if (flag == "--slow-ms") slow_ms = value;
    if (flag == "--batch") batch = value;
    if (flag == "--fail-at") fail_at = value;
  }
  try {
    auto pg = dtrain::init_process_group();
    const int rank = pg->rank();
    const char* restarts = std::getenv("DTRAIN_RESTART_COUNT");
    const bool first_attempt = restarts == nullptr || std::string(restarts) == "0";
    dtrain::ProgressReporter progress(rank, {.interval = std::chrono::milliseconds(100)});
    progress.step(0, 0);  // starts the clock
    for (int step = 1; step <= steps; ++step) {
      if (rank == 1 && first_attempt && step == fail_at) return 3;
      std::this_thread::sleep_for(std::chrono::milliseconds(compute_ms + (rank == 1 ? slow_ms : 0)));
      std::vector<float> grad{1.0f};
      pg->allreduce(dtrain::TensorView::of(grad))->wait();
      progress.step(step, batch);
    }
    if (rank == 0) std::printf("DONE step %d\n", steps);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "progress_worker: %s\n", e.what());
    return 1;
  }
}
