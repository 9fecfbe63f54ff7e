// The trace-driven cluster simulator behind `dtrain sched-sim` (docs/scheduling.md). Time moves
// in scheduling intervals: every job runs for an interval where it was placed, then the policy
// chooses who holds GPUs next and the placement policy says where; a job whose GPUs change
// pays a restart (checkpoint, reload) before it computes again.
//
// How fast a job goes where it is placed:
// - application jobs follow the measured traces (application.h): step time on that placement
//   and batch, statistical efficiency at that batch, epoch by epoch, to the last epoch;
// - rigid jobs run their duration;
// and both slow down
// - by `interference` while they span several nodes and share one of them with another job that
//   spans several nodes (Pollux's model of network interference; its evaluation sets 0, 0.25
//   and 0.5),
// - by `share_slowdown` while they share any node with another job (PCIe, host memory and CPU
//   contention; an assumption to explore, 0 by default: no published figure is taken as given),
// - and application jobs spanning racks synchronize `cross_rack_slowdown` times slower (an
//   oversubscribed uplink; also an assumption, 1 by default).
// A job's pace is also that of its slowest GPU model (ClusterSpec::node_speed). All together
// multiply: pace x GPU speed x (1 - interference) x (1 - share_slowdown).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "scheduling/application.h"
#include "scheduling/placement.h"
#include "scheduling/policy.h"
#include "scheduling/workload.h"

namespace dtrain::scheduling {

struct SimulationOptions {
  ClusterSpec cluster;
  std::string policy = "tiresias";
  PolicyOptions policy_options;
  Placement placement = Placement::kSpread;
  double auto_load = 1.0;              // auto: pack once active jobs ask for this share of the GPUs
  double interval = 60;                // seconds between scheduling decisions
  double restart_seconds = 30;         // a job's pause when its GPUs change
  double interference = 0;             // slowdown of multi-node jobs sharing a node, in [0, 1)
  double share_slowdown = 0;           // slowdown of any job sharing a node, in [0, 1)
  double cross_rack_slowdown = 1;      // synchronization time factor across racks, >= 1
  double max_seconds = 365 * 86400.0;  // simulated time after which unfinished jobs are an error
};

struct JobResult {
  std::string name;
  std::string application;  // empty for a rigid job
  int gpus = 0;
  double submit = 0, start = -1, finish = -1;  // start: first time it held GPUs
  double queued = 0;                           // seconds active without GPUs
  double gpu_seconds = 0;                      // GPUs held, times seconds
  int restarts = 0;  // placements after the first (each after a preemption)
  double jct() const { return finish - submit; }
};

struct SimulationResult {
  std::string policy, placement;
  std::vector<JobResult> jobs;  // in submission order
  double makespan = 0;          // first submission to last completion
  double utilization = 0;       // GPU-seconds held / (cluster GPUs x makespan)
  // Summaries over the jobs.
  double average_jct() const;
  double jct_percentile(double p) const;  // p in [0, 100], nearest rank
  double average_queueing() const;
};

// Replays `jobs` (in any order: they are taken by submission time) on the cluster.
// `applications` must hold every application the jobs name. Intervals and restarts are whole
// seconds.
// Throws InvalidArgumentError for a job that can never run (more GPUs than the cluster, batch
// sizes outside its traces) and when jobs are still unfinished after max_seconds.
SimulationResult simulate(const std::vector<JobSpec>& jobs,
                          const std::map<std::string, Application>& applications,
                          const SimulationOptions& options);

}  // namespace dtrain::scheduling
