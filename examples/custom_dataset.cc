// Your own dataset, split over the ranks by dtrain's DistributedSampler, through LibTorch's
// DataLoader; a classifier trained on it data parallel.
//
//   build/bin/dtrain run -n 2 -- build/bin/custom_dataset
//   [rank 0] epoch 0: 500 samples on this rank, every sample once in the job: yes, accuracy 0.93
//
// The sampler gives each rank a disjoint share of a permutation drawn from the seed and the
// epoch (PyTorch's DistributedSampler's indices), so the ranks agree without communicating.
#include <cmath>
#include <cstdio>
#include <exception>

#include <torch/torch.h>

#include "dtrain/dtrain.h"
#include "dtrain/torch/distributed_data_parallel.h"
#include "dtrain/torch/distributed_sampler.h"

// Points on two rings (radius 1: class 0, radius 2: class 1), computed from the index: any
// dataset with get() and size() works the same way (files, a database, ...).
class Rings : public torch::data::datasets::Dataset<Rings> {
 public:
  torch::data::Example<> get(size_t i) override {
    const double angle = std::fmod(i * 2.399963, 2 * M_PI), radius = 1.0 + i % 2;
    auto x = torch::tensor({radius * std::cos(angle), radius * std::sin(angle)}, torch::kFloat);
    return {x, torch::tensor(static_cast<int64_t>(i % 2))};
  }
  c10::optional<size_t> size() const override { return 1000; }
};

int main() try {
  auto pg = dtrain::init_process_group();
  torch::manual_seed(0);
  auto model = torch::nn::Sequential(torch::nn::Linear(2, 32), torch::nn::ReLU(),
                                     torch::nn::Linear(32, 2));
  dtrain::DistributedDataParallel ddp(model, pg);
  torch::optim::Adam opt(model->parameters(), 0.02);
  Rings rings;

  for (uint64_t epoch = 0; epoch < 5; ++epoch) {
    dtrain::DistributedSampler sampler(*rings.size(), pg->size(), pg->rank(), true, /*seed=*/7);
    sampler.set_epoch(epoch);  // a new permutation every epoch, the same on every rank
    std::vector<int64_t> seen{0, 0};  // samples and the sum of their indices
    for (size_t i : sampler.indices()) seen[0] += 1, seen[1] += static_cast<int64_t>(i);
    auto loader = torch::data::make_data_loader(
        rings.map(torch::data::transforms::Stack<>()), std::move(sampler),
        torch::data::DataLoaderOptions().batch_size(50));
    int64_t correct = 0;
    for (auto& batch : *loader) {
      opt.zero_grad();
      auto logits = ddp.forward([&] { return model->forward(batch.data); });
      torch::nn::functional::cross_entropy(logits, batch.target).backward();
      opt.step();
      correct += logits.argmax(1).eq(batch.target).sum().item<int64_t>();
    }
    // Every sample exactly once in the job: the counts and index sums add up to the dataset's.
    std::vector<int64_t> job = seen;
    job.push_back(correct);
    pg->allreduce(dtrain::TensorView::of(job))->wait();
    const int64_t n = *rings.size();
    const bool once = job[0] == n && job[1] == n * (n - 1) / 2;
    if (pg->rank() == 0)
      std::printf("epoch %d: %lld samples on this rank, every sample once in the job: %s, "
                  "accuracy %.2f\n",
                  static_cast<int>(epoch), static_cast<long long>(seen[0]), once ? "yes" : "NO",
                  static_cast<double>(job[2]) / n);
    if (!once) return 1;
  }
  return 0;
} catch (const std::exception& e) {  // dtrain errors say who, what and how long
  std::fprintf(stderr, "custom_dataset: %s\n", e.what());
  return 1;
}
