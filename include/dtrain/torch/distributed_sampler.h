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
//
// Resuming mid-epoch, on any number of ranks: rank r trains perm[r], perm[r + W], ... (W ranks),
// so once every rank has trained t samples the whole job has consumed perm[0 : t * W], whatever
// each rank did. set_epoch(epoch, consumed) deals out the rest, perm[consumed : n], the same way
// over the ranks of the new job (padded with the epoch's first samples, or cut with drop_last,
// to equal lengths), so every sample of the epoch is trained exactly once across a restart, even
// one with another world size. With the same world size it continues exactly where the stopped
// run was; with consumed = 0 the indices are PyTorch's.
//
//   sampler.set_epoch(ckpt.epoch, ckpt.epoch_consumed);   // the rest of the epoch
//   ... train sampler.indices()[0 .. k) ...
//   save(epoch, sampler.consumed(k));                      // the epoch's position for a checkpoint
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include <torch/data/samplers/base.h>

namespace dtrain {

// The constructor's optional arguments (PyTorch's defaults), named so that the Python binding
// offers the same defaults.
struct DistributedSamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
};

class DistributedSampler : public torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  DistributedSampler(size_t dataset_size, int num_replicas, int rank,
                     bool shuffle = DistributedSamplerOptions{}.shuffle,
                     uint64_t seed = DistributedSamplerOptions{}.seed,
                     bool drop_last = DistributedSamplerOptions{}.drop_last);

  // Chooses the epoch's permutation (seed + epoch) and deals out its samples from position
  // `consumed` on (0 = the whole epoch): those not yet trained by the job when `consumed`
  // samples of the epoch were, by all ranks together. consumed >= the dataset size leaves
  // nothing to train in this epoch.
  void set_epoch(uint64_t epoch, size_t consumed = 0);
  uint64_t epoch() const { return epoch_; }
  // Where this epoch's indices start in its permutation (set_epoch's `consumed`).
  size_t epoch_start() const { return start_; }
  // The epoch's position once every rank has trained the first `trained` of its indices():
  // what set_epoch needs to resume after them. Never more than the dataset size.
  size_t consumed(size_t trained) const;
  // The same, after the samples handed out by next().
  size_t consumed() const { return consumed(position_); }

  // This rank's samples of the current epoch, in order.
  const std::vector<size_t>& indices() const { return indices_; }
  size_t num_samples() const { return num_samples_; }  // per rank, of this (rest of the) epoch
  // Whether this rank's k-th index only pads the epoch to equal lengths (a sample another rank
  // trains, or trained, too): a program that must train each sample exactly once gives it no
  // weight.
  bool is_padding(size_t k) const {
    return static_cast<size_t>(rank_) + k * static_cast<size_t>(num_replicas_) >=
           dataset_size_ - start_;
  }
  size_t dataset_size() const { return dataset_size_; }
  int num_replicas() const { return num_replicas_; }
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
  size_t start_ = 0;  // samples of the epoch consumed before this rank's indices_
  size_t num_samples_ = 0;
  size_t position_ = 0;
  std::vector<size_t> indices_;
};

}  // namespace dtrain
