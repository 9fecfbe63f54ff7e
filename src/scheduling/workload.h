// The jobs a simulation replays. Two kinds of rows:
// - an application job (Pollux's workloads: name,time,application,num_replicas,batch_size): it
//   trains the application's model to its last epoch, and how long that takes follows from the
//   measured traces and from where it is placed;
// - a rigid job (a cluster's job table, e.g. Philly's: timestamp or time, num_gpus, duration):
//   it runs for `duration` seconds on its GPUs when placed as tightly as they allow, longer when
//   interference slows it.
#pragma once

#include <string>
#include <vector>

namespace dtrain::scheduling {

struct JobSpec {
  std::string name;
  double submit = 0;        // seconds from the start of the trace
  int gpus = 0;             // GPUs it asks for, all at once (gang-scheduled)
  std::string application;  // application job: its model; empty for a rigid job
  int batch_size = 0;       // application job: total batch size
  double duration = 0;      // rigid job: seconds of work on its GPUs
};

struct WorkloadOptions {
  // Rigid job tables: only rows of this cluster (column "cluster"), "" for all;
  std::string cluster;
  // only rows submitted in [start, start + hours) (timestamp "YYYY-MM-DD HH:MM:SS" UTC; empty =
  // from the first row), rebased so that the first selected second is 0;
  std::string start;
  double hours = 0;         // 0 = to the end
  double min_duration = 0;  // and rows at least this long (Pollux dropped jobs under 60 s)
};

// Reads a workload; the kind follows from the header. Jobs come sorted by submission time.
// Throws InvalidArgumentError naming FILE:LINE of a malformed row.
std::vector<JobSpec> read_workload(const std::string& path, const WorkloadOptions& options = {});

}  // namespace dtrain::scheduling
