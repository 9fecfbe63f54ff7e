// ShardedDataParallel on the mpi backend: ctest starts it under `mpirun -np 3`; every rank runs
// every test, each stage against one process on the whole batch. (The native and Gloo backends
// are tested in sharded_data_parallel_test.)
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "dtrain/dtrain.h"
#include "dtrain/torch/sharded_data_parallel.h"
#include "torch/torch_test_support.h"

namespace dtrain {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> pg = [] {
    InitOptions o;
    o.group.backend = "mpi";
    o.group.timeout = 60s;
    return init_process_group(o);
  }();
  return pg;
}

torch::nn::Sequential make_seq() {
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 4));
}

class ShardedOnMpi : public ::testing::TestWithParam<int> {};

TEST_P(ShardedOnMpi, TrainsAsOneProcess) {
  at::set_num_threads(1);
  auto pg = world();
  const int rank = pg->rank(), n = pg->size();
  auto model = make_seq();
  auto ref = make_seq();
  ShardedDataParallel sdp(model, pg, {.stage = GetParam()});
  torch::optim::SGD opt(sdp.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 4; ++step) {
    auto global = testing::global_batch(step, 12);
    auto local = testing::shard(global, rank, n);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(sdp.forward(local.x), local.y).backward();
    opt.step();
    ref_opt.zero_grad();
    torch::nn::functional::cross_entropy(ref->forward(global.x), global.y).backward();
    ref_opt.step();
  }
  auto full = sdp.full_parameters();
  for (const auto& p : ref->named_parameters())
    EXPECT_LT((full.at(p.key()) - p.value()).abs().max().item<double>(), 1e-5)
        << "rank " << rank << ", stage " << GetParam() << ": " << p.key();
}

INSTANTIATE_TEST_SUITE_P(Stages, ShardedOnMpi, ::testing::Values(1, 2, 3));

}  // namespace
}  // namespace dtrain
