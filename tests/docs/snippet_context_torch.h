// What the documentation's LibTorch snippets use without declaring it (see snippet_context.h).
#pragma once

#include <torch/torch.h>

#include <utility>

#include "docs/snippet_context.h"
#include "dtrain/torch/distributed_sampler.h"

namespace snippets {
extern torch::nn::Linear model;  // a TORCH_MODULE holder, as users write them
extern std::unique_ptr<torch::optim::SGD> sgd;
extern std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
extern dtrain::DistributedSampler sampler;
extern size_t dataset_size;
extern int64_t step;
extern size_t k;
torch::nn::Sequential make_model();  // docs/pipeline.md: the model cut into stages
extern at::Tensor test_x;
}  // namespace snippets
