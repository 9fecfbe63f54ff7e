// A worker for the preemption tests (preemption_test.cc runs it under `dtrain run`): it trains
// "samples" 0..N-1, one per step, rank 0 appending "sample S" to DIR/samples at each step, and
// checkpoints only when preempted: dtrain::Preemption stops every rank after the same step, rank 0
// saves the next step to DIR/ckpt, and all exit 75 once it has. Run again, it resumes from
// DIR/ckpt; the samples file then holds every sample exactly once however often the job was
// preempted.
//
//   preempt_worker --dir D [--steps N] [--step-ms MS]
//
// Prints "resumed from step S" when it starts from a checkpoint, "preempted after step S" when
// it stops for a requeue, "DONE step S" at the end.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/dtrain.h"

namespace {

void append(const std::string& path, const std::string& line) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  std::string text = line + "\n";
  [[maybe_unused]] ssize_t n = ::write(fd, text.data(), text.size());
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  int steps = 100, step_ms = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--dir")
      dir = value;
    else if (flag == "--steps")
      steps = std::stoi(value);
    else if (flag == "--step-ms")
      step_ms = std::stoi(value);
  }
  if (dir.empty()) {
    std::fprintf(stderr, "preempt_worker: --dir is required\n");
    return 2;
  }
  try {
    auto pg = dtrain::init_process_group();
    dtrain::Preemption preemption(pg);
    const int rank = pg->rank();
    append(dir + "/pids", "rank " + std::to_string(rank) + " pid " + std::to_string(::getpid()));
    std::vector<int32_t> start{0};
    if (rank == 0) std::ifstream(dir + "/ckpt") >> start[0];
    pg->broadcast(dtrain::TensorView::of(start))->wait();
    if (rank == 0 && start[0] > 0) std::printf("resumed from step %d\n", start[0]);
    std::fflush(stdout);
    for (int step = start[0]; step < steps; ++step) {
      std::vector<float> grad{1.0f};  // the step's "training": one all-reduce
      pg->allreduce(dtrain::TensorView::of(grad))->wait();
      if (rank == 0) append(dir + "/samples", "sample " + std::to_string(step));
      std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
      if (preemption.should_stop()) {
        if (rank == 0) {
          std::ofstream(dir + "/ckpt.tmp") << step + 1 << "\n";
          std::filesystem::rename(dir + "/ckpt.tmp", dir + "/ckpt");
          std::printf("preempted after step %d\n", step);
        }
        return preemption.requeue();
      }
    }
    pg->barrier()->wait();
    if (rank == 0) std::printf("DONE step %d\n", steps);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "preempt_worker: %s\n", e.what());
    return 1;
  }
}
