// A worker for the elastic launcher tests (elastic_test.cc runs it under `dtrain run`): it forms
// a process group from the environment, all-reduces once per step, and rank 0 checkpoints the
// step and a running total after each, so that a restarted round resumes where the last one got
// to and the total stays exactly one per step.
//
//   elastic_worker --dir D [--steps N] [--step-ms MS] [--stop-file F]
//                  [--fail-node-rank K --fail-after S]
//
// Writes to D: "pids" (a line "restart R rank K pid P" per worker started), "progress" (rank 0:
// a line "restart R world W step S" per step), "ckpt" (rank 0: "step total", replaced
// atomically). Rank 0 prints "resumed from step S" when it starts from a checkpoint, and
// "DONE step S total T world W" at the end. --stop-file ends the run after the step in which
// rank 0 sees the file. --fail-after S makes local rank 0 of node rank K exit with code 3 after
// S steps of its round (every round).
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/dtrain.h"

namespace {

struct Args {
  std::string dir;
  int steps = 20;
  int step_ms = 20;
  std::string stop_file;
  int fail_node_rank = -1;
  int fail_after = -1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--dir")
      a.dir = value;
    else if (flag == "--steps")
      a.steps = std::stoi(value);
    else if (flag == "--step-ms")
      a.step_ms = std::stoi(value);
    else if (flag == "--stop-file")
      a.stop_file = value;
    else if (flag == "--fail-node-rank")
      a.fail_node_rank = std::stoi(value);
    else if (flag == "--fail-after")
      a.fail_after = std::stoi(value);
    else {
      std::fprintf(stderr, "elastic_worker: unknown flag %s\n", flag.c_str());
      std::exit(2);
    }
  }
  if (a.dir.empty()) {
    std::fprintf(stderr, "elastic_worker: --dir is required\n");
    std::exit(2);
  }
  return a;
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : 0;
}

// One line appended with one write: lines of several processes never mix.
void append(const std::string& path, const std::string& line) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  std::string text = line + "\n";
  [[maybe_unused]] ssize_t n = ::write(fd, text.data(), text.size());
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  const int restart = env_int("DTRAIN_RESTART_COUNT");
  const std::string ckpt = a.dir + "/ckpt";
  append(a.dir + "/pids", "restart " + std::to_string(restart) + " rank " +
                              std::string(std::getenv("RANK") ? std::getenv("RANK") : "?") +
                              " pid " + std::to_string(::getpid()));
  try {
    auto pg = dtrain::init_process_group();
    const int rank = pg->rank(), world = pg->size();

    // Rank 0 reads the checkpoint and tells the others (a sum where only rank 0 adds).
    std::vector<double> state{0, 0};  // step, total
    if (rank == 0) std::ifstream(ckpt) >> state[0] >> state[1];
    pg->allreduce(dtrain::TensorView::of(state))->wait();
    int step = static_cast<int>(state[0]);
    double total = state[1];
    if (rank == 0 && step > 0) {
      char what[96];
      std::snprintf(what, sizeof(what), "from step %d (total %g)", step, total);
      std::printf("resumed %s\n", what);
      dtrain::announce_resumed(rank, what);  // the agent reports it, from the round's store
    }
    std::fflush(stdout);

    const bool may_fail =
        a.fail_after >= 0 && env_int("NODE_RANK") == a.fail_node_rank && env_int("LOCAL_RANK") == 0;
    int steps_here = 0;
    while (step < a.steps) {
      if (may_fail && steps_here == a.fail_after) {
        std::fprintf(stderr, "elastic_worker: rank %d failing on purpose after %d steps\n", rank,
                     steps_here);
        return 3;
      }
      // [one per rank, stop asked]: the sum must be the world size.
      std::vector<float> v{1.0f, 0.0f};
      if (rank == 0 && !a.stop_file.empty() && std::filesystem::exists(a.stop_file)) v[1] = 1;
      pg->allreduce(dtrain::TensorView::of(v))->wait();
      if (v[0] != static_cast<float>(world)) {
        std::fprintf(stderr, "elastic_worker: rank %d: all-reduce gave %g, expected %d\n", rank,
                     v[0], world);
        return 5;
      }
      ++step;
      ++steps_here;
      total += v[0] / static_cast<float>(world);
      std::this_thread::sleep_for(std::chrono::milliseconds(a.step_ms));
      if (rank == 0) {
        {
          std::ofstream out(ckpt + ".tmp");
          out << step << " " << total << "\n";
        }
        std::filesystem::rename(ckpt + ".tmp", ckpt);
        append(a.dir + "/progress", "restart " + std::to_string(restart) + " world " +
                                        std::to_string(world) + " step " + std::to_string(step));
      }
      if (v[1] > 0) break;
    }
    pg->barrier()->wait();
    if (rank == 0) std::printf("DONE step %d total %g world %d\n", step, total, world);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "elastic_worker: %s\n", e.what());
    return 1;
  }
}
