// Predicting a data-parallel training step at scale from the cost model (`dtrain predict`,
// docs/scaling.md): the step's compute, measured on one rank, plus what its communication
// leaves exposed, for each way of laying the job out. The collectives are priced by the same
// CostModel that picks dtrain's algorithms, with the constants of the network described.
#pragma once

#include <string>
#include <vector>

#include "comm/cost_model.h"

namespace dtrain::comm {

struct StepModel {
  double parameters = 0;                     // of the model
  double bytes_per_gradient = 4;             // fp32 gradients
  double compute_s = 0;                      // forward + backward of one rank's batch, measured
  double backward_share = 2.0 / 3;           // the part of compute_s that is backward
  double bucket_bytes = 25.0 * 1024 * 1024;  // gradients reduced per bucket (DDP's default)
  int ps_servers = 0;       // parameter server layout: servers, each on a host of its own
  int pipeline_stages = 4;  // pipeline layout: stages, micro-batches per step,
  int micro_batches = 16;   // and the activations one micro-batch sends to the next stage
  double activation_bytes = 4.0 * 1024 * 1024;
};

struct ClusterShape {
  int ranks = 1;
  int per_host = 1;        // ranks per host (GPUs per server)
  int hosts_per_rack = 0;  // 0 = every host in one rack
};

struct StepPrediction {
  std::string layout;
  int ranks = 0;
  bool runs = true;       // false: the layout cannot run on this shape (the rest is 0)
  double step_s = 0;      // per step
  double comm_s = 0;      // communication, overlapped or not
  double exposed_s = 0;   // of which the step waits for
  double efficiency = 0;  // throughput per rank against one rank alone
};

// Layouts: ddp-ring, ddp-hierarchical, ddp-recursive-doubling (flat all-reduce algorithms, or
// the cost model's choice per bucket: ddp), ps (S servers), zero3 (parameters, gradients and
// optimizer state sharded), pipeline (stages x data-parallel replicas).
const std::vector<std::string>& step_layouts();
StepPrediction predict_step(const CostModel& model, const StepModel& step,
                            const ClusterShape& shape, const std::string& layout);
// The topology the cost model sees for the whole job.
Topology job_topology(const ClusterShape& shape);

}  // namespace dtrain::comm
