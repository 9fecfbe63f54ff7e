// How a job's ranks are arranged when a model is both cut into pipeline stages and replicated:
// a grid of `stages` x `replicas` (world size = stages x replicas), rank = stage x replicas +
// replica, so the replicas of one stage are neighbours (on one host when a host runs several:
// the gradient all-reduce is the heavier traffic) and a pipeline runs across hosts.
//
//   auto world = dtrain::init_process_group();                 // 4 ranks
//   dtrain::ParallelLayout layout(world, {.pipeline_stages = 2});
//   layout.stage();            // 0 or 1
//   layout.pipeline_group();   // this replica's stages: rank i of it is stage i
//   layout.data_group();       // this stage's replicas: gradients are averaged in it
#pragma once

#include <memory>
#include <string>

#include "dtrain/process_group.h"

namespace dtrain {

struct ParallelLayoutOptions {
  int pipeline_stages = 1;  // the world size must be a multiple of it
};

class ParallelLayout {
 public:
  // Collective over `world`: every rank builds the same groups. Throws InvalidArgumentError when
  // the world size is not a multiple of the stages.
  ParallelLayout(std::shared_ptr<ProcessGroup> world, ParallelLayoutOptions options);

  int stage() const { return stage_; }
  int stages() const { return stages_; }
  int replica() const { return replica_; }
  int replicas() const { return replicas_; }
  const std::shared_ptr<ProcessGroup>& world() const { return world_; }
  const std::shared_ptr<ProcessGroup>& pipeline_group() const { return pipeline_; }
  const std::shared_ptr<ProcessGroup>& data_group() const { return data_; }
  // The world rank of (stage, replica).
  int rank_of(int stage, int replica) const { return stage * replicas_ + replica; }
  // "stage 1 of 2, replica 0 of 2 (world rank 2)", for logs.
  std::string describe() const;

 private:
  std::shared_ptr<ProcessGroup> world_, pipeline_, data_;
  int stages_, replicas_, stage_, replica_;
};

}  // namespace dtrain
