#include "dtrain/parallel_layout.h"

#include <vector>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain {

ParallelLayout::ParallelLayout(std::shared_ptr<ProcessGroup> world, ParallelLayoutOptions options)
    : world_(std::move(world)), stages_(options.pipeline_stages) {
  if (!world_) throw InvalidArgumentError("ParallelLayout: the world group is null");
  const int n = world_->size();
  if (stages_ < 1 || stages_ > n || n % stages_ != 0)
    throw InvalidArgumentError(fmt::format(
        "rank {}: {} pipeline stages do not divide the {} ranks of the job; give a divisor of {} "
        "(the ranks make a grid of stages x replicas)",
        world_->rank(), stages_, n, n));
  replicas_ = n / stages_;
  stage_ = world_->rank() / replicas_;
  replica_ = world_->rank() % replicas_;
  // Every rank creates every group in the same order (new_group is collective over world).
  for (int r = 0; r < replicas_; ++r) {
    std::vector<int> ranks;
    for (int s = 0; s < stages_; ++s) ranks.push_back(rank_of(s, r));
    auto g = world_->new_group(ranks);
    if (r == replica_) pipeline_ = std::move(g);
  }
  for (int s = 0; s < stages_; ++s) {
    std::vector<int> ranks;
    for (int r = 0; r < replicas_; ++r) ranks.push_back(rank_of(s, r));
    auto g = world_->new_group(ranks);
    if (s == stage_) data_ = std::move(g);
  }
}

std::string ParallelLayout::describe() const {
  return fmt::format("stage {} of {}, replica {} of {} (world rank {})", stage_, stages_, replica_,
                     replicas_, world_->rank());
}

}  // namespace dtrain
