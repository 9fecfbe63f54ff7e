// How a job's ranks are arranged when a model is cut into pipeline stages, its layers are cut
// across tensor-parallel ranks, and the whole is replicated: a grid of `stages` x `replicas` x
// `tensor` (world size = their product), rank = (stage x replicas + replica) x tensor + t. The
// tensor-parallel ranks of a layer are nearest neighbours (their all-reduces come every layer,
// in forward and backward: the heaviest traffic, best on one host), then the replicas of a stage
// (the gradient all-reduce, once a step), and a pipeline runs across hosts.
//
//   auto world = dtrain::init_process_group();                 // 4 ranks
//   dtrain::ParallelLayout layout(world, {.pipeline_stages = 2});
//   layout.stage();            // 0 or 1
//   layout.pipeline_group();   // this replica's stages: rank i of it is stage i
//   layout.data_group();       // this stage's replicas: gradients are averaged in it
//   dtrain::ParallelLayout tp(world, {.tensor_parallel = 2});  // 2 (tensor) x 2 (data)
//   tp.tensor_group();         // the ranks that share each layer (dtrain/torch/tensor_parallel.h)
#pragma once

#include <memory>
#include <string>

#include "dtrain/process_group.h"

namespace dtrain {

struct ParallelLayoutOptions {
  int pipeline_stages = 1;  // the world size must be a multiple of stages x tensor_parallel
  int tensor_parallel = 1;  // ranks that share each layer
};

class ParallelLayout {
 public:
  // Collective over `world`: every rank builds the same groups. Throws InvalidArgumentError when
  // the world size is not a multiple of stages x tensor_parallel.
  ParallelLayout(std::shared_ptr<ProcessGroup> world, ParallelLayoutOptions options);

  int stage() const { return stage_; }
  int stages() const { return stages_; }
  int replica() const { return replica_; }
  int replicas() const { return replicas_; }
  int tensor_rank() const { return tensor_rank_; }
  int tensor_size() const { return tensor_; }
  const std::shared_ptr<ProcessGroup>& world() const { return world_; }
  const std::shared_ptr<ProcessGroup>& pipeline_group() const { return pipeline_; }
  const std::shared_ptr<ProcessGroup>& data_group() const { return data_; }
  const std::shared_ptr<ProcessGroup>& tensor_group() const { return tensor_group_; }
  // The world rank of (stage, replica, tensor rank).
  int rank_of(int stage, int replica, int t = 0) const {
    return (stage * replicas_ + replica) * tensor_ + t;
  }
  // "stage 1 of 2, replica 0 of 2, tensor 1 of 2 (world rank 5)", for logs.
  std::string describe() const;

 private:
  std::shared_ptr<ProcessGroup> world_, pipeline_, data_, tensor_group_;
  int stages_, tensor_, replicas_, stage_, replica_, tensor_rank_;
};

}  // namespace dtrain
