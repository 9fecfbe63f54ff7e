#include "dtrain/parallel_layout.h"

#include <vector>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain {

ParallelLayout::ParallelLayout(std::shared_ptr<ProcessGroup> world, ParallelLayoutOptions options)
    : world_(std::move(world)), stages_(options.pipeline_stages), tensor_(options.tensor_parallel) {
  if (!world_) throw InvalidArgumentError("ParallelLayout: the world group is null");
  const int n = world_->size();
  if (stages_ < 1 || tensor_ < 1 || stages_ > n || tensor_ > n || n % (stages_ * tensor_) != 0)
    throw InvalidArgumentError(fmt::format(
        "rank {}: {} pipeline stages x {} tensor-parallel ranks do not divide the {} ranks of the "
        "job; give numbers whose product divides {} (the ranks make a grid of stages x replicas "
        "x tensor)",
        world_->rank(), stages_, tensor_, n, n));
  replicas_ = n / (stages_ * tensor_);
  const int r = world_->rank();
  tensor_rank_ = r % tensor_;
  replica_ = (r / tensor_) % replicas_;
  stage_ = r / (tensor_ * replicas_);
  // Every rank creates every group in the same order (new_group is collective over world).
  for (int rep = 0; rep < replicas_; ++rep)
    for (int t = 0; t < tensor_; ++t) {
      std::vector<int> ranks;
      for (int s = 0; s < stages_; ++s) ranks.push_back(rank_of(s, rep, t));
      auto g = world_->new_group(ranks);
      if (rep == replica_ && t == tensor_rank_) pipeline_ = std::move(g);
    }
  for (int s = 0; s < stages_; ++s)
    for (int t = 0; t < tensor_; ++t) {
      std::vector<int> ranks;
      for (int rep = 0; rep < replicas_; ++rep) ranks.push_back(rank_of(s, rep, t));
      auto g = world_->new_group(ranks);
      if (s == stage_ && t == tensor_rank_) data_ = std::move(g);
    }
  for (int s = 0; s < stages_; ++s)
    for (int rep = 0; rep < replicas_; ++rep) {
      std::vector<int> ranks;
      for (int t = 0; t < tensor_; ++t) ranks.push_back(rank_of(s, rep, t));
      auto g = world_->new_group(ranks);
      if (s == stage_ && rep == replica_) tensor_group_ = std::move(g);
    }
}

std::string ParallelLayout::describe() const {
  if (tensor_ == 1)
    return fmt::format("stage {} of {}, replica {} of {} (world rank {})", stage_, stages_,
                       replica_, replicas_, world_->rank());
  return fmt::format("stage {} of {}, replica {} of {}, tensor {} of {} (world rank {})", stage_,
                     stages_, replica_, replicas_, tensor_rank_, tensor_, world_->rank());
}

}  // namespace dtrain
