// DistributedSampler: which samples this rank trains on in an epoch.
//
//   dtrain::DistributedSampler sampler(dataset.size(), pg->size(), pg->rank(), /*shuffle=*/true,
//                                      /*seed=*/42);
//   for (epoch ...) { sampler.set_epoch(epoch); for (auto i : sampler.indices()) ... }
//
// Every epoch each sample goes to exactly one rank; the shuffle is a permutation drawn from
// seed + epoch with LibTorch's CPU generator (the same indices as PyTorch's DistributedSampler),
// so every rank computes the same split without communicating. When the dataset does not divide
// evenly, the list is padded with its first samples (every rank gets ceil(n / replicas)) or, with
// drop_last, cut to floor(n / replicas) per rank. It is also a LibTorch sampler, so it plugs into
// torch::data::make_data_loader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include <torch/data/samplers/base.h>

namespace dtrain {

class DistributedSampler : public torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  DistributedSampler(size_t dataset_size, int num_replicas, int rank, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);

  // Chooses the epoch's permutation (seed + epoch) and rewinds to its start.
  void set_epoch(uint64_t epoch);
  uint64_t epoch() const { return epoch_; }

  // This rank's samples of the current epoch, in order.
  const std::vector<size_t>& indices() const { return indices_; }
  size_t num_samples() const { return num_samples_; }  // per rank
  size_t total_size() const { return num_samples_ * static_cast<size_t>(num_replicas_); }

  // torch::data::samplers::Sampler
  void reset(c10::optional<size_t> new_size = c10::nullopt) override;
  c10::optional<std::vector<size_t>> next(size_t batch_size) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  void compute();

  size_t dataset_size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  uint64_t epoch_ = 0;
  size_t num_samples_ = 0;
  size_t position_ = 0;
  std::vector<size_t> indices_;
};

}  // namespace dtrain
