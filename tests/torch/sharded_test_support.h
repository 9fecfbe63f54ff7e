// Shared by the tests of sharded state (checkpoints on disk, snapshots in memory): a fresh
// directory, training steps on each rank's share of deterministic batches, and comparing two
// models' parameters by name. Inside forked ranks only (see torch_test_support.h).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtrain/torch/sharded_data_parallel.h"
#include "torch/torch_test_support.h"

namespace dtrain::testing {

inline std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

// Steps [from, to) of the sharded run on this rank's share of each global batch of 12;
// `before_step`, where given, is called before each optimizer step.
inline void train_sharded_steps(ShardedDataParallel& sdp, torch::optim::Optimizer& opt, int rank,
                                int n, int from, int to,
                                const std::function<void()>& before_step = {}) {
  for (int step = from; step < to; ++step) {
    auto local = shard(global_batch(step, 12), rank, n);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(sdp.forward(local.x), local.y).backward();
    if (before_step) before_step();
    opt.step();
  }
}

// The largest difference of any element of any parameter `a` names from `b`'s.
inline double max_difference(const std::map<std::string, at::Tensor>& a,
                             const std::map<std::string, at::Tensor>& b) {
  double worst = 0;
  for (const auto& [name, t] : a)
    worst = std::max(worst, (t - b.at(name)).abs().max().item<double>());
  return worst;
}

}  // namespace dtrain::testing
