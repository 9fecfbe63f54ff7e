// A throwaway Slurm on this machine, for tests that run real srun and sbatch jobs: its own munged
// (a fresh key, its socket in a temporary directory), slurmctld and slurmd in the foreground as
// children of the test, one node (this host's short name at 127.0.0.1), no cgroups
// (proctrack/linuxproc, task/none), state, spool and logs in the temporary directory. Nothing of
// the machine's own Slurm or munge is used or touched. The node declares 4 CPUs whatever the
// machine has (SlurmdParameters=config_overrides): Slurm refuses --ntasks-per-node above a node's
// CPUs even with --overcommit, and a job of 3 or 4 ranks is what the tests need. It also declares
// 4 GPUs, stand-in device files in the temporary directory, which Slurm allocates and binds to
// tasks (CUDA_VISIBLE_DEVICES) as it would real ones.
//
// Nothing is left running, even when the test fails or is killed: the daemons die with the test
// (PR_SET_PDEATHSIG); job steps (slurmstepd detaches from slurmd) and their tasks are found by
// their working directory or the marker variable DTRAIN_TEST_SLURM=<directory> and killed by
// the destructor, or by the next cluster's constructor when the test that owned them is gone.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::testing {

class SlurmCluster {
 public:
  // Starts the cluster and waits until its node is idle. When it cannot (not root, a program
  // missing, a daemon that does not come up within `timeout`), up() is false, skip_reason() says
  // why (with the daemons' last log lines) and nothing is left running.
  explicit SlurmCluster(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  ~SlurmCluster();
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  bool up() const { return up_; }
  const std::string& skip_reason() const { return skip_reason_; }
  const std::string& dir() const { return dir_; }
  // The node's name: this host's short name, the first (only) host of SLURM_JOB_NODELIST.
  const std::string& node() const { return node_; }
  // Whether the node has its 4 stand-in GPUs (making them needs CAP_MKNOD).
  bool has_gpus() const { return gpus_; }
  // Variables for srun, sbatch and sinfo: SLURM_CONF and the marker.
  std::map<std::string, std::optional<std::string>> client_env() const;
  // The last lines of each daemon's output, for failure messages.
  std::string logs() const;

 private:
  bool start(std::chrono::milliseconds timeout);
  pid_t spawn(const std::string& name, const std::vector<std::string>& argv);
  void stop();

  bool up_ = false;
  std::string skip_reason_;
  std::string dir_;
  std::string node_;
  bool gpus_ = false;
  std::vector<std::pair<std::string, pid_t>> daemons_;  // name, pid; started in this order
};

}  // namespace dtrain::testing
