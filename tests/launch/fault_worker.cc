// A job with one fault in it, for the doctor tests (doctor_test.cc runs it under `dtrain run`
// with DTRAIN_HANG_SECONDS): every rank all-reduces once a step; `--fault` breaks it.
//
//   fault_worker --fault none|skip|compute|order|p2p|slow [--steps N] [--say-little]
//
//   skip     rank 1 skips step 6's all-reduce and waits for a message from rank 0 instead
//   compute  rank 1 computes (sleeps) for 10 minutes before step 6's all-reduce
//   order    from step 6, rank 1 calls broadcast then all-reduce; the others the other way round
//   p2p      at step 6, ranks 0 and 1 both receive from each other first: a deadlock
//   slow     rank 1 computes 3x as long as the others every step (30 ms against 10 ms)
//
// --say-little: a failure prints "step failed" only, not dtrain's error (as a program that
// catches it and says something of its own).
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/dtrain.h"

int main(int argc, char** argv) {
  std::string fault = "none";
  int steps = 10;
  bool say_little = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--say-little") say_little = true;
    if (i + 1 == argc) break;
    if (flag == "--fault") fault = argv[++i];
    if (flag == "--steps") steps = std::stoi(argv[++i]);
  }
  using std::chrono::milliseconds;
  try {
    auto pg = dtrain::init_process_group();
    const int rank = pg->rank();
    std::vector<float> grad(256, 1.0f);
    auto allreduce = [&] { pg->allreduce(dtrain::TensorView::of(grad))->wait(); };
    for (int step = 1; step <= steps; ++step) {
      const bool faulty = step == 6 && rank == 1;
      std::this_thread::sleep_for(milliseconds(fault == "slow" && rank == 1 ? 30 : 10));
      if (fault == "skip" && faulty) {
        pg->recv(dtrain::TensorView::of(grad), 0, 7);
        continue;
      }
      if (fault == "compute" && faulty) std::this_thread::sleep_for(std::chrono::minutes(10));
      if (fault == "order" && step >= 6) {
        if (rank == 1) {
          pg->broadcast(dtrain::TensorView::of(grad))->wait();
          allreduce();
        } else {
          allreduce();
          pg->broadcast(dtrain::TensorView::of(grad))->wait();
        }
        continue;
      }
      if (fault == "p2p" && step == 6 && rank < 2) {
        pg->recv(dtrain::TensorView::of(grad), 1 - rank);
        pg->send(dtrain::TensorView::of(grad), 1 - rank);
      }
      allreduce();
    }
    if (rank == 0) std::printf("DONE %d steps\n", steps);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fault_worker: %s\n", say_little ? "step failed" : e.what());
    return 1;
  }
}
