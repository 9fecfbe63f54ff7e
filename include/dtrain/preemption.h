// Preemption that loses nothing. A cluster that takes GPUs back warns the job first: Slurm with
// SIGUSR1 (`--signal=USR1@90`) or SIGTERM, Kubernetes with SIGTERM and a grace period, `dtrain
// run` passing on what it got. A Preemption turns that warning into a stop that every rank
// takes at the same step boundary, so that the checkpoint written there is exact:
//
//   dtrain::Preemption preemption(pg);              // before the training loop
//   for (; step < steps; ++step) {
//     train_one_step(...);
//     if (preemption.should_stop()) {               // every rank, every step: true on all at once
//       checkpoint.save(step + 1, ...);
//       return preemption.requeue();                // 75, once every rank has saved
//     }
//   }
//
// The signal handler only records the signal (one atomic store); the agreement is a one-integer
// all-reduce (the maximum of every rank's flag) in should_stop(), on the caller's thread. Rank 0
// may be warned and rank 3 not, or a signal may land between two ranks' checks: the all-reduce
// makes them all stop after the same step either way.
#pragma once

#include <csignal>
#include <memory>
#include <vector>

namespace dtrain {

class ProcessGroup;

struct PreemptionOptions {
  std::vector<int> signals{SIGTERM, SIGUSR1};  // the warnings to catch
  int check_every = 1;  // steps between agreements; >1 amortizes the all-reduce on tiny steps
};

class Preemption {
 public:
  // The exit code of a job that stopped for a requeue and will resume (EX_TEMPFAIL). `dtrain
  // run` exits with it when every worker did; the Slurm scripts `dtrain submit` writes requeue
  // on it, and Kubernetes manifests restart the pod on it without counting a failure.
  static constexpr int kRequeueExitCode = 75;

  // Catches `options.signals` from now until destruction (the previous handlers come back
  // then). One Preemption at a time per process; throws InvalidArgumentError for a second.
  explicit Preemption(std::shared_ptr<ProcessGroup> pg, PreemptionOptions options = {});
  ~Preemption();
  Preemption(const Preemption&) = delete;
  Preemption& operator=(const Preemption&) = delete;

  // Collective: every rank calls it after every step (the same number of times). True, on every
  // rank after the same call, once any rank has been warned; then it stays true.
  bool should_stop();
  // Collective, after should_stop() and the checkpoint: waits until every rank has saved (an
  // engine may kill the others as soon as one exits: srun --kill-on-bad-exit, a pod's
  // containers) and returns kRequeueExitCode, for main to return.
  int requeue();
  // The signal this process caught (0: none), without asking the others.
  int signal() const;

 private:
  std::shared_ptr<ProcessGroup> pg_;
  PreemptionOptions options_;
  int64_t calls_ = 0;
  bool stopping_ = false;
  std::vector<struct sigaction> previous_;
};

}  // namespace dtrain
