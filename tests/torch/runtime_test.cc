// Every program linked with dtrain::torch starts with LibTorch's threads set for its share of the
// machine, under whichever launcher started it: runtime_probe (which calls nothing of dtrain) run
// with the variables of a single process, torchrun, mpirun and Slurm, and with OMP_NUM_THREADS.
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

const std::string kProbe = std::string(DTRAIN_BIN_DIR) + "/runtime_probe";

// The probe's thread count with exactly these variables (env -i: nothing inherited).
int probe_threads(const std::vector<std::string>& vars) {
  std::string command = "env -i";
  for (const auto& v : vars) command += " " + v;
  command += " " + kProbe;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  int threads = -1;
  if (std::fscanf(pipe, "threads %d", &threads) != 1) threads = -1;
  ::pclose(pipe);
  return threads;
}

// What the defaults promise: the CPUs this process may use when it is bound to fewer than the
// machine has, else the cores divided by the processes on this machine.
int expected(int local_processes) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && CPU_COUNT(&allowed) < cores)
    return std::max(1, CPU_COUNT(&allowed));
  return std::max(1, cores / local_processes);
}

TEST(Runtime, ThreadsFollowTheLaunchersCountOfLocalProcesses) {
  EXPECT_EQ(probe_threads({}), expected(1)) << "a process started on its own";
  EXPECT_EQ(probe_threads({"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2"}),
            expected(2))
      << "torchrun / dtrain run";
  EXPECT_EQ(probe_threads({"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2",
                           "OMPI_COMM_WORLD_LOCAL_RANK=1", "OMPI_COMM_WORLD_LOCAL_SIZE=2"}),
            expected(2))
      << "mpirun";
  EXPECT_EQ(probe_threads({"SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=1", "SLURM_NODEID=0",
                           "SLURM_JOB_NODELIST=node1", "SLURM_TASKS_PER_NODE=2"}),
            expected(2))
      << "srun";
  EXPECT_EQ(probe_threads({"OMP_NUM_THREADS=3", "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2",
                           "OMPI_COMM_WORLD_LOCAL_RANK=0", "OMPI_COMM_WORLD_LOCAL_SIZE=2"}),
            3)
      << "OMP_NUM_THREADS is the user's word";
}

}  // namespace
