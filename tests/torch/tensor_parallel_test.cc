// Tensor-parallel layers over real processes, each against its serial twin built from the same
// seed: outputs, input gradients, weight gradients and parameters after training; tensor x data
// parallelism on 4 ranks; refusals.
#include "dtrain/torch/tensor_parallel.h"

#include <gtest/gtest.h>

#include <climits>
#include <csignal>
#include <cmath>

#include <fmt/ranges.h>

#include "dtrain/error.h"
#include "dtrain/memory_estimate.h"
#include "dtrain/parallel_layout.h"
#include "dtrain/torch/distributed_data_parallel.h"
#include "dtrain/torch/runtime.h"
#include "support/expect.h"
#include "support/multiproc.h"
#include "torch/torch_test_support.h"

namespace dtrain {
namespace {

using namespace std::chrono_literals;
using testing::expect_all_ok;
using testing::make_group;
using testing::run_ranks;

double diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// This rank's block of `t` along `dim`, of n blocks.
at::Tensor block(const at::Tensor& t, int64_t dim, int rank, int n) {
  return t.chunk(n, dim)[static_cast<size_t>(rank)];
}

TEST(TensorParallel, ColumnAndRowLinearsEqualTheWholeLinear) {
  for (int n : {2, 3}) {
    const int port = testing::free_port();
    expect_all_ok(run_ranks(n, [&](int rank) {
      at::set_num_threads(1);
      auto pg = make_group(rank, n, port);
      torch::manual_seed(5);
      ColumnParallelLinear column(6, 12, pg, ColumnParallelLinearOptions{.gather_output = true});
      torch::manual_seed(5);
      torch::nn::Linear whole_column(6, 12);
      torch::manual_seed(6);
      RowParallelLinear row(12, 5, pg, RowParallelLinearOptions{.input_is_parallel = false});
      torch::manual_seed(6);
      torch::nn::Linear whole_row(12, 5);
      RANK_CHECK(column->weight.size(0) == 12 / n && row->weight.size(1) == 12 / n,
                 "shards {} and {}", column->weight.sizes().vec(), row->weight.sizes().vec());

      torch::manual_seed(7);
      at::Tensor x = torch::randn({4, 6}, torch::requires_grad());
      at::Tensor x_ref = x.detach().clone().requires_grad_();
      at::Tensor y = row->forward(column->forward(x));
      at::Tensor y_ref = whole_row->forward(whole_column->forward(x_ref));
      RANK_CHECK(diff(y, y_ref) < 1e-6, "outputs differ by {}", diff(y, y_ref));
      y.pow(2).sum().backward();
      y_ref.pow(2).sum().backward();
      RANK_CHECK(diff(x.grad(), x_ref.grad()) < 1e-5, "input gradients differ by {}",
                 diff(x.grad(), x_ref.grad()));
      RANK_CHECK(diff(column->weight.grad(), block(whole_column->weight.grad(), 0, rank, n)) < 1e-5,
                 "column weight gradients differ");
      RANK_CHECK(diff(column->bias.grad(), block(whole_column->bias.grad(), 0, rank, n)) < 1e-5,
                 "column bias gradients differ");
      RANK_CHECK(diff(row->weight.grad(), block(whole_row->weight.grad(), 1, rank, n)) < 1e-5,
                 "row weight gradients differ");
      RANK_CHECK(diff(row->bias.grad(), whole_row->bias.grad()) < 1e-5, "row bias gradients differ");
    }, 60s));
  }
}

// The serial twins.
struct MlpImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  MlpImpl(int64_t h, int64_t f) {
    fc1 = register_module("fc1", torch::nn::Linear(h, f));
    fc2 = register_module("fc2", torch::nn::Linear(f, h));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2->forward(at::gelu(fc1->forward(x))); }
};
TORCH_MODULE(Mlp);

at::Tensor attention(const at::Tensor& x, torch::nn::Linear& qkv, torch::nn::Linear& out,
                     int64_t heads, bool causal) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2) / heads;
  auto parts = qkv->forward(x).chunk(3, -1);
  auto split = [&](const at::Tensor& p) { return p.reshape({b, t, heads, d}).transpose(1, 2); };
  at::Tensor scores = at::matmul(split(parts[0]), split(parts[1]).transpose(-2, -1)) / std::sqrt(d);
  if (causal)
    scores = scores.masked_fill(at::ones({t, t}, at::kBool).triu(1),
                                -std::numeric_limits<float>::infinity());
  return out->forward(
      at::matmul(at::softmax(scores, -1), split(parts[2])).transpose(1, 2).reshape({b, t, heads * d}));
}

TEST(TensorParallel, MlpTrainsAsItsSerialTwin) {
  const int n = 2;
  const int port = testing::free_port();
  expect_all_ok(run_ranks(n, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, n, port);
    torch::manual_seed(11);
    ParallelMLP mlp(8, 32, pg);
    torch::manual_seed(11);
    Mlp ref(8, 32);
    torch::optim::SGD opt(mlp->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    for (int step = 0; step < 4; ++step) {
      torch::manual_seed(100 + step);
      at::Tensor x = torch::randn({6, 8}), target = torch::randn({6, 8});
      opt.zero_grad();
      torch::nn::functional::mse_loss(mlp->forward(x), target).backward();
      opt.step();
      ref_opt.zero_grad();
      torch::nn::functional::mse_loss(ref->forward(x), target).backward();
      ref_opt.step();
    }
    RANK_CHECK(diff(mlp->fc1->weight, block(ref->fc1->weight, 0, rank, n)) < 1e-5, "fc1 differs");
    RANK_CHECK(diff(mlp->fc2->weight, block(ref->fc2->weight, 1, rank, n)) < 1e-5, "fc2 differs");
    RANK_CHECK(diff(mlp->fc2->bias, ref->fc2->bias) < 1e-5, "fc2's bias differs");
  }, 60s));
}

TEST(TensorParallel, SelfAttentionEqualsItsSerialTwin) {
  for (bool causal : {false, true}) {
    const int n = 2;
    const int port = testing::free_port();
    expect_all_ok(run_ranks(n, [&](int rank) {
      at::set_num_threads(1);
      auto pg = make_group(rank, n, port);
      const int64_t hidden = 16, heads = 4;
      torch::manual_seed(21);
      ParallelSelfAttention attn(hidden, heads, pg, causal);
      torch::manual_seed(21);
      torch::nn::Linear qkv(hidden, 3 * hidden), out(hidden, hidden);
      torch::manual_seed(22);
      at::Tensor x = torch::randn({2, 5, hidden}, torch::requires_grad());
      at::Tensor x_ref = x.detach().clone().requires_grad_();
      at::Tensor y = attn->forward(x);
      at::Tensor y_ref = attention(x_ref, qkv, out, heads, causal);
      RANK_CHECK(diff(y, y_ref) < 1e-5, "causal {}: outputs differ by {}", causal, diff(y, y_ref));
      y.pow(2).sum().backward();
      y_ref.pow(2).sum().backward();
      RANK_CHECK(diff(x.grad(), x_ref.grad()) < 1e-4, "input gradients differ by {}",
                 diff(x.grad(), x_ref.grad()));
      RANK_CHECK(diff(attn->out->weight.grad(), block(out->weight.grad(), 1, rank, n)) < 1e-4,
                 "the output projection's gradients differ");
    }, 60s));
  }
}

// 4 ranks as 2 (tensor) x 2 (data): each replica trains on half of every batch, DDP averages
// over the data group; the result is the serial MLP trained on the whole batch.
TEST(TensorParallel, TensorTimesDataParallelOnFourRanks) {
  const int port = testing::free_port();
  expect_all_ok(run_ranks(4, [&](int rank) {
    at::set_num_threads(1);
    auto world = make_group(rank, 4, port);
    ParallelLayout layout(world, {.tensor_parallel = 2});
    RANK_CHECK(layout.tensor_rank() == rank % 2 && layout.replica() == rank / 2,
               "{}", layout.describe());
    torch::manual_seed(31);
    ParallelMLP mlp(8, 16, layout.tensor_group());
    torch::manual_seed(31);
    Mlp ref(8, 16);
    DistributedDataParallel ddp(mlp.ptr(), layout.data_group());
    torch::optim::Adam opt(mlp->parameters(), 0.01);
    torch::optim::Adam ref_opt(ref->parameters(), 0.01);
    for (int step = 0; step < 4; ++step) {
      torch::manual_seed(200 + step);
      at::Tensor x = torch::randn({8, 8}), target = torch::randn({8, 8});
      at::Tensor mine = x.chunk(2, 0)[static_cast<size_t>(layout.replica())];
      at::Tensor my_target = target.chunk(2, 0)[static_cast<size_t>(layout.replica())];
      opt.zero_grad();
      auto y = ddp.forward([&] { return mlp->forward(mine); });
      torch::nn::functional::mse_loss(y, my_target).backward();
      opt.step();
      ref_opt.zero_grad();
      torch::nn::functional::mse_loss(ref->forward(x), target).backward();
      ref_opt.step();
    }
    const int t = layout.tensor_rank();
    RANK_CHECK(diff(mlp->fc1->weight, block(ref->fc1->weight, 0, t, 2)) < 1e-5, "fc1 differs by {}",
               diff(mlp->fc1->weight, block(ref->fc1->weight, 0, t, 2)));
    RANK_CHECK(diff(mlp->fc2->weight, block(ref->fc2->weight, 1, t, 2)) < 1e-5, "fc2 differs");
  }, 90s));
}

// What a rank holds of a tensor-parallel MLP with Adam, counted by jemalloc, against
// `dtrain estimate --layout tp`: the model states cut N ways (the row layer's bias is whole on
// every rank: 1 KiB here).
TEST(TensorParallel, ModelStatesAreAsEstimated) {
  const int n = 2;
  const int port = testing::free_port();
  auto results = run_ranks(n, [&](int rank) {
    at::set_num_threads(1);
    if (heap_allocated_memory() < 0) ::_exit(5);
    auto pg = make_group(rank, n, port);
    const int64_t hidden = 256, ffn = 1024;
    const int64_t params = 2 * hidden * ffn + ffn + hidden;  // the whole MLP's
    int64_t states = INT64_MAX;
    for (int round = 0; round < 3; ++round) {  // the least of the last two (see sharding's test)
      const int64_t before = heap_allocated_memory();
      torch::manual_seed(1);
      ParallelMLP mlp(hidden, ffn, pg);
      torch::optim::Adam opt(mlp->parameters(), 1e-3);
      for (int step = 0; step < 2; ++step) {
        auto x = torch::randn({2, hidden});
        opt.zero_grad();
        mlp->forward(x).pow(2).mean().backward();
        opt.step();
      }
      if (round > 0) states = std::min(states, heap_allocated_memory() - before);
    }
    const auto e = estimate_memory({.parameters = params, .optimizer = "adam", .world_size = n,
                                    .layout = "tp"});
    const int64_t estimated = e.parameters + e.gradients + e.optimizer;
    std::printf("tp, rank %d of %d: model states %lld bytes, estimated %lld\n", rank, n,
                static_cast<long long>(states), static_cast<long long>(estimated));
    RANK_CHECK(std::abs(states - estimated) <= 0.1 * states, "model states {} bytes, estimated {}",
               states, estimated);
  }, 60s);
  for (const auto& r : results)
    if (r.exit_code == 5) GTEST_SKIP() << "the tests were not linked with jemalloc";
  expect_all_ok(results);
}

// A rank of the tensor-parallel group dies: the others fail in their next layer's all-reduce,
// naming it, long before the group's timeout.
TEST(TensorParallel, AKilledRankFailsTheOthersNamingIt) {
  const int port = testing::free_port();
  auto results = run_ranks(3, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, 3, port, {}, 30s);
    torch::manual_seed(1);
    ParallelMLP mlp(6, 12, pg);
    auto x = torch::randn({4, 6});
    mlp->forward(x).sum().backward();
    if (rank == 1) ::raise(SIGKILL);
    const auto start = std::chrono::steady_clock::now();
    try {
      mlp->forward(x).sum().backward();
    } catch (const std::exception& e) {
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      RANK_CHECK(std::string(e.what()).find("rank 1") != std::string::npos, "{}", e.what());
      RANK_CHECK(s < 15, "failed after {:.1f} s", s);
      ::_exit(3);
    }
    throw std::runtime_error("the layer ran without rank 1");
  }, 60s);
  EXPECT_EQ(results[0].exit_code, 3);
  EXPECT_EQ(results[1].signal, SIGKILL);
  EXPECT_EQ(results[2].exit_code, 3);
}

TEST(TensorParallel, SizesTheGroupDoesNotDivideAreRefused) {
  const int port = testing::free_port();
  expect_all_ok(run_ranks(3, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, 3, port);
    auto refused = [&](const std::function<void()>& make, const std::string& text) {
      try {
        make();
      } catch (const InvalidArgumentError& e) {
        RANK_CHECK(std::string(e.what()).find(text) != std::string::npos, "'{}' lacks '{}'",
                   e.what(), text);
        return;
      }
      throw std::runtime_error("accepted: " + text);
    };
    refused([&] { ColumnParallelLinear(4, 8, pg); },
            "ColumnParallelLinear: out_features 8 is not a multiple of the 3 ranks");
    refused([&] { RowParallelLinear(8, 4, pg); },
            "RowParallelLinear: in_features 8 is not a multiple of the 3 ranks");
    refused([&] { ParallelSelfAttention(16, 4, pg); },
            "ParallelSelfAttention: heads 4 is not a multiple of the 3 ranks");
    refused([&] { ParallelLayout(pg, {.pipeline_stages = 1, .tensor_parallel = 2}); },
            "1 pipeline stages x 2 tensor-parallel ranks do not divide the 3 ranks");
  }, 60s));
}

}  // namespace
}  // namespace dtrain
