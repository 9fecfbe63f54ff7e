// DistributedSampler: PyTorch's split (pad or drop to equal lengths, then every
// num_replicas-th index from `rank`), with the permutation of torch.randperm(n, seed + epoch).
#include "dtrain/torch/distributed_sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/serialize/archive.h>

#include "dtrain/error.h"

namespace dtrain {

DistributedSampler::DistributedSampler(size_t dataset_size, int num_replicas, int rank,
                                       bool shuffle, uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  if (num_replicas < 1 || rank < 0 || rank >= num_replicas)
    throw InvalidArgumentError(fmt::format(
        "DistributedSampler: rank {} is not in [0, num_replicas={}); pass the process group's "
        "rank() and size()",
        rank, num_replicas));
  if (drop_last && dataset_size < static_cast<size_t>(num_replicas))
    throw InvalidArgumentError(fmt::format(
        "DistributedSampler (rank {}): drop_last with {} samples and {} replicas leaves every "
        "rank with nothing; use fewer ranks or drop_last=false",
        rank, dataset_size, num_replicas));
  compute();
}

void DistributedSampler::set_epoch(uint64_t epoch) {
  epoch_ = epoch;
  compute();
}

void DistributedSampler::compute() {
  const size_t n = dataset_size_;
  const size_t r = static_cast<size_t>(num_replicas_);
  if (drop_last_ && n % r != 0) {
    num_samples_ = (n - r + r - 1) / r;  // ceil((n - r) / r) == floor(n / r)
  } else {
    num_samples_ = (n + r - 1) / r;
  }
  const size_t total = num_samples_ * r;

  std::vector<size_t> order(n);
  if (shuffle_) {
    auto gen = at::detail::createCPUGenerator(seed_ + epoch_);
    at::Tensor perm = at::randperm(static_cast<int64_t>(n), gen, at::kLong);
    const int64_t* p = perm.data_ptr<int64_t>();
    for (size_t i = 0; i < n; ++i) order[i] = static_cast<size_t>(p[i]);
  } else {
    for (size_t i = 0; i < n; ++i) order[i] = i;
  }
  if (total > n) {  // pad with the first samples, repeated as often as needed
    order.reserve(total);
    for (size_t i = 0; order.size() < total; ++i) order.push_back(order[i % n]);
  } else {
    order.resize(total);
  }
  indices_.clear();
  indices_.reserve(num_samples_);
  for (size_t i = static_cast<size_t>(rank_); i < total; i += r) indices_.push_back(order[i]);
  position_ = 0;
}

void DistributedSampler::reset(c10::optional<size_t> new_size) {
  if (new_size.has_value() && *new_size != dataset_size_) {
    dataset_size_ = *new_size;
    compute();
  }
  position_ = 0;
}

c10::optional<std::vector<size_t>> DistributedSampler::next(size_t batch_size) {
  if (position_ >= indices_.size()) return c10::nullopt;
  size_t end = std::min(indices_.size(), position_ + batch_size);
  std::vector<size_t> batch(indices_.begin() + static_cast<ptrdiff_t>(position_),
                            indices_.begin() + static_cast<ptrdiff_t>(end));
  position_ = end;
  return batch;
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("epoch", at::tensor(static_cast<int64_t>(epoch_), at::kLong), /*is_buffer=*/true);
  archive.write("position", at::tensor(static_cast<int64_t>(position_), at::kLong),
                /*is_buffer=*/true);
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  at::Tensor epoch = at::empty({}, at::kLong);
  at::Tensor position = at::empty({}, at::kLong);
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("position", position, /*is_buffer=*/true);
  set_epoch(static_cast<uint64_t>(epoch.item<int64_t>()));
  position_ = static_cast<size_t>(position.item<int64_t>());
}

}  // namespace dtrain
