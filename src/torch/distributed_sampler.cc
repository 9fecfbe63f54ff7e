// DistributedSampler: PyTorch's split (pad or drop to equal lengths, then every
// num_replicas-th index from `rank`), with the permutation of torch.randperm(n, seed + epoch).
// A resumed epoch splits the rest of the permutation, perm[start:], the same way; padding takes
// the epoch's first samples, as PyTorch's does, so a job resumed on as many ranks as it stopped
// with sees exactly the indices it would have seen.
#include "dtrain/torch/distributed_sampler.h"

#include <algorithm>

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
  // An empty dataset would "train" zero steps and exit 0, which looks like success.
  if (dataset_size == 0)
    throw InvalidArgumentError(
        "DistributedSampler: the dataset is empty (0 samples): there is nothing to train; check "
        "the data path and any filter or limit on the number of samples");
  if (drop_last && dataset_size < static_cast<size_t>(num_replicas))
    throw InvalidArgumentError(fmt::format(
        "DistributedSampler (rank {}): drop_last with {} samples and {} replicas leaves every "
        "rank with nothing; use fewer ranks or drop_last=false",
        rank, dataset_size, num_replicas));
  compute();
}

void DistributedSampler::set_epoch(uint64_t epoch, size_t consumed) {
  epoch_ = epoch;
  start_ = std::min(consumed, dataset_size_);
  compute();
}

size_t DistributedSampler::consumed(size_t trained) const {
  trained = std::min(trained, num_samples_);
  return std::min(dataset_size_, start_ + trained * static_cast<size_t>(num_replicas_));
}

void DistributedSampler::compute() {
  const size_t n = dataset_size_;
  const size_t r = static_cast<size_t>(num_replicas_);
  start_ = std::min(start_, n);
  const size_t left = n - start_;  // samples of the epoch still to train
  // Equal lengths: padded up to ceil(left / r) per rank, or cut to floor(left / r) (drop_last).
  num_samples_ = drop_last_ ? left / r : (left + r - 1) / r;
  const size_t total = num_samples_ * r;

  std::vector<size_t> perm(n);
  if (shuffle_) {
    auto gen = at::detail::createCPUGenerator(seed_ + epoch_);
    at::Tensor t = at::randperm(static_cast<int64_t>(n), gen, at::kLong);
    const int64_t* p = t.data_ptr<int64_t>();
    for (size_t i = 0; i < n; ++i) perm[i] = static_cast<size_t>(p[i]);
  } else {
    for (size_t i = 0; i < n; ++i) perm[i] = i;
  }
  std::vector<size_t> order(perm.begin() + static_cast<ptrdiff_t>(start_), perm.end());
  if (total > order.size()) {  // pad with the epoch's first samples, as often as needed
    order.reserve(total);
    for (size_t i = 0; order.size() < total; ++i) order.push_back(perm[i % n]);
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

// The archive holds the epoch's global position (not this rank's), so it loads into a sampler
// of any world size.
void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("epoch", at::tensor(static_cast<int64_t>(epoch_), at::kLong), /*is_buffer=*/true);
  archive.write("consumed", at::tensor(static_cast<int64_t>(consumed()), at::kLong),
                /*is_buffer=*/true);
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  at::Tensor epoch = at::empty({}, at::kLong);
  at::Tensor consumed = at::empty({}, at::kLong);
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("consumed", consumed, /*is_buffer=*/true);
  set_epoch(static_cast<uint64_t>(epoch.item<int64_t>()),
            static_cast<size_t>(consumed.item<int64_t>()));
}

}  // namespace dtrain
