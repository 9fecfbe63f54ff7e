// The elastic agent behind `dtrain run --nnodes MIN:MAX --max-restarts K --rdzv-endpoint H:P`:
// one per machine. The agents form the job in rounds through the rendezvous store
// (launch/rendezvous.h); each round, every agent starts its workers with that round's identity
// (RANK, WORLD_SIZE, ... and DTRAIN_RESTART_COUNT), and a store of their own for the round, so
// that a restarted round never reads the keys of the one before.
//
// When a worker fails anywhere, its agent records the cause in the store; every agent watches
// for it (every 100 ms) and stops its workers, prints the cause in one line and meets the others
// in the next round, where the workers resume from their own last checkpoint. An agent that
// stops heartbeating is left out; a machine whose workers keep failing sits out for a while; a
// new agent is taken in at the next restart, at once when the job has room for it. More failures
// than --max-restarts end the job on every machine with a summary of every round.
//
// The agent whose address is the rendezvous endpoint (or the first able to bind it) hosts the
// store; without an endpoint (one machine) it hosts one on loopback. Losing the host ends the
// job, as it does under torchrun.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::launch {

struct ElasticOptions {
  std::vector<std::string> command;  // the worker command
  int nproc = 1;                     // workers on this machine
  bool bind = true;                  // each worker on its own share of the CPUs (cpu_binding.h)
  int min_nodes = 1;                 // the job runs while at least MIN machines take part
  int max_nodes = 1;                 // and takes in new ones up to MAX
  int max_restarts = 0;              // failures the job survives
  std::string endpoint;              // "host:port" of the rendezvous store; "" = this machine only
  std::string run_id = "dtrain";     // the job: agents of other ids share a store but not rounds
  std::string node_name;             // "" = the host name; failures are counted per node name
  std::string local_addr;            // "" = the local address that routes to the store
  std::chrono::milliseconds join_timeout{600'000};  // for a round to form
  std::chrono::milliseconds last_call{2000};        // once MIN agents joined, for more to come
  std::chrono::milliseconds heartbeat_timeout{10'000};
  int exclude_after = 3;  // failures of a node's workers within exclude_for that exclude it
  std::chrono::milliseconds exclude_for{60'000};
  std::chrono::milliseconds grace_period{3000};  // SIGTERM to SIGKILL when stopping workers
  bool prefix_output = true;
  // Per local rank, when given (dtrain run --gpus-per-proc): its CUDA_VISIBLE_DEVICES and the
  // CPUs it runs on (instead of an equal share), the same in every round.
  struct LocalRank {
    std::string visible_devices;
    std::vector<int> cpus;
  };
  std::vector<LocalRank> local_ranks;
  // Set on every worker, on top of the round's identity (DTRAIN_PROGRESS_DIR for the metrics).
  std::vector<std::pair<std::string, std::string>> env;
  // Called as each round's workers start on this machine: the job's restarts so far and this
  // machine's first rank (the metrics endpoint names the ranks it serves).
  std::function<void(int restarts, int first_rank)> on_round;
};

// Runs this machine's part of the job until the job ends; returns the exit code of `dtrain run`:
// 0 when every worker of the last round succeeded, the last failure's code (128 + signal) when
// the restarts ran out, 128 + signal when this agent was interrupted. Throws InvalidArgumentError
// for bad options and the store's errors when the rendezvous store is lost or unreachable.
int run_elastic(const ElasticOptions& options);

}  // namespace dtrain::launch
