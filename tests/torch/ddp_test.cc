// DistributedDataParallel over real processes: equality with one process on the whole batch,
// no_sync accumulation, buffers, unused parameters, join with uneven inputs, fp16, bf16, int8
// and int4 compression; each .grad a view of its bucket (gradient_as_bucket_view).
#include "dtrain/torch/distributed_data_parallel.h"

#include <gtest/gtest.h>

#include "support/expect.h"
#include "support/multiproc.h"
#include "torch/torch_test_support.h"

namespace dtrain {
namespace {

using namespace std::chrono_literals;
using testing::make_group;
using testing::expect_all_ok;
using testing::run_ranks;

// With gradient_as_bucket_view, each .grad is its slice of the bucket: the parameters of one
// bucket share storage, and a .grad stays where it is from step to step, whether zeroed in place
// (backward accumulates into the bucket) or reset (it gets its slice back). `where`: each
// parameter's .grad after the previous step.
void check_bucket_views(const DistributedDataParallel& ddp, const torch::nn::Module& net, int step,
                        std::vector<const void*>& where) {
  std::vector<const void*> now;
  for (const auto& p : net.parameters()) now.push_back(p.grad().data_ptr());
  // Before step 1 the buckets are rebuilt (arrival order), so the slices move once then.
  if (step > 1) RANK_CHECK(now == where, "step {}: a .grad moved", step);
  where = now;
  const auto named = net.named_parameters();
  bool shared = false;
  for (const auto& names : ddp.buckets())
    for (size_t i = 1; i < names.size(); ++i) {
      RANK_CHECK(named[names[i]].grad().is_alias_of(named[names[0]].grad()),
                 "step {}: {} is not in {}'s bucket", step, names[i], names[0]);
      shared = true;
    }
  RANK_CHECK(shared, "no bucket holds two parameters");
}

// N ranks with B/N samples each vs one process with B, after several SGD+momentum steps.
void check_matches_one_process(int n, std::shared_ptr<CommHook> hook, double tolerance,
                               at::ScalarType dtype = at::kFloat, bool bucket_views = false) {
  const int port = testing::free_port();
  auto results = run_ranks(n, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, n, port);
    auto net = testing::make_net(/*bn_eval=*/true);
    auto ref = testing::make_net(/*bn_eval=*/true);
    net->to(dtype);
    ref->to(dtype);
    DdpOptions o;
    o.first_bucket_cap_bytes = 64;  // several buckets, so ordering and rebuilding are exercised
    o.bucket_cap_bytes = 100;
    o.comm_hook = hook;
    o.gradient_as_bucket_view = bucket_views;
    DistributedDataParallel ddp(net.ptr(), pg, o);
    RANK_CHECK(ddp.buckets().size() >= 3, "{} buckets", ddp.buckets().size());
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    std::vector<const void*> where;
    for (int step = 0; step < 6; ++step) {
      auto global = testing::global_batch(step, 12);
      global.x = global.x.to(dtype);
      auto local = testing::shard(global, rank, n);
      if (bucket_views)
        opt.zero_grad(/*set_to_none=*/step % 3 == 0);
      else
        opt.zero_grad();
      auto out = ddp.forward([&] { return net->forward(local.x); });
      torch::nn::functional::cross_entropy(out, local.y).backward();
      if (bucket_views) check_bucket_views(ddp, *net, step, where);
      opt.step();
      ref_opt.zero_grad();
      torch::nn::functional::cross_entropy(ref->forward(global.x), global.y).backward();
      ref_opt.step();
    }
    double diff = testing::max_difference(*net, *ref);
    RANK_CHECK(diff < tolerance, "parameters differ from one process by {}", diff);
    for (const auto& p : net->parameters())
      RANK_CHECK(testing::same_on_all_ranks(*pg, p), "parameters differ between ranks");
  }, 90s);
  expect_all_ok(results);
}

TEST(Ddp, TwoRanksMatchOneProcessWithTheWholeBatch) { check_matches_one_process(2, nullptr, 1e-5); }
TEST(Ddp, ThreeRanksMatchOneProcessWithTheWholeBatch) { check_matches_one_process(3, nullptr, 1e-5); }
// 16, 8 and 4 bits a value on the wire: replicas stay bit-identical (checked inside) and close to
// one process.
TEST(Ddp, Fp16CompressionStaysClose) { check_matches_one_process(2, fp16_compress_hook(), 5e-3); }
TEST(Ddp, Bf16CompressionStaysClose) { check_matches_one_process(3, bf16_compress_hook(), 5e-3); }
TEST(Ddp, Int8CompressionStaysClose) { check_matches_one_process(3, int8_compress_hook(), 5e-3); }
TEST(Ddp, Int4CompressionStaysClose) { check_matches_one_process(2, int4_compress_hook(), 5e-2); }
// The wire takes f32: gradients of another type are cast to 16 bits and back instead.
TEST(Ddp, Bf16CompressionCastsOtherTypes) {
  check_matches_one_process(2, bf16_compress_hook(), 5e-3, at::kDouble);
}
// The default hook divides each gradient as it goes into the bucket (in place where .grad is the
// bucket); a 16-bit hook takes the sums as they are (no copy where .grad is the bucket).
TEST(Ddp, GradientsAsBucketViewsAreTheBucketsAndMatchOneProcess) {
  check_matches_one_process(2, nullptr, 1e-5, at::kFloat, /*bucket_views=*/true);
}
TEST(Ddp, GradientsAsBucketViewsWithBf16CompressionStayClose) {
  check_matches_one_process(3, bf16_compress_hook(), 5e-3, at::kFloat, /*bucket_views=*/true);
}

void check_no_sync_accumulation(bool gradient_as_bucket_view) {
  const int port = testing::free_port();
  const int n = 2;
  auto results = run_ranks(n, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, n, port);
    auto net = testing::make_net(true);
    auto ref = testing::make_net(true);
    DdpOptions o;
    o.gradient_as_bucket_view = gradient_as_bucket_view;
    DistributedDataParallel ddp(net.ptr(), pg, o);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 3; ++step) {
      // Zeroed in place (a bucket view keeps accumulating in its bucket) or reset.
      opt.zero_grad(/*set_to_none=*/step % 2 == 1);
      ref_opt.zero_grad();
      for (int micro = 0; micro < 3; ++micro) {  // two local passes, then one that reduces
        auto global = testing::global_batch(10 * step + micro, 8);
        auto local = testing::shard(global, rank, n);
        if (micro < 2) {
          auto guard = ddp.no_sync();
          auto out = ddp.forward([&] { return net->forward(local.x); });
          torch::nn::functional::cross_entropy(out, local.y).backward();
        } else {
          auto out = ddp.forward([&] { return net->forward(local.x); });
          torch::nn::functional::cross_entropy(out, local.y).backward();
        }
        torch::nn::functional::cross_entropy(ref->forward(global.x), global.y).backward();
      }
      opt.step();
      ref_opt.step();
    }
    double diff = testing::max_difference(*net, *ref);
    RANK_CHECK(diff < 1e-5, "accumulated parameters differ from the larger batch by {}", diff);
  }, 60s);
  expect_all_ok(results);
}

TEST(Ddp, NoSyncAccumulationEqualsTheLargerBatch) { check_no_sync_accumulation(false); }
TEST(Ddp, NoSyncAccumulationInBucketViewsEqualsTheLargerBatch) { check_no_sync_accumulation(true); }

TEST(Ddp, BuffersFollowRankZeroBeforeEachForward) {
  const int port = testing::free_port();
  const int n = 2;
  auto results = run_ranks(n, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, n, port);
    auto net = testing::make_net(/*bn_eval=*/false);  // train mode: statistics move per rank
    DistributedDataParallel ddp(net.ptr(), pg);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 3; ++step) {
      auto local = testing::shard(testing::global_batch(step, 8), rank, n);
      opt.zero_grad();
      auto out = ddp.forward([&] { return net->forward(local.x); });
      torch::nn::functional::cross_entropy(out, local.y).backward();
      opt.step();
    }
    // Each rank's last forward moved its statistics with its own data...
    RANK_CHECK(!testing::same_on_all_ranks(*pg, net->bn->running_mean), "expected local drift");
    // ...and the next forward starts from rank 0's.
    ddp.pre_forward();
    for (const auto& b : net->buffers())
      RANK_CHECK(testing::same_on_all_ranks(*pg, b), "a buffer differs after pre_forward");
  }, 60s);
  expect_all_ok(results);
}

struct BranchyImpl : torch::nn::Module {
  torch::nn::Linear a{4, 3}, b{4, 3}, c{4, 3};
  BranchyImpl() {
    register_module("a", a);
    register_module("b", b);
    register_module("c", c);
  }
};
TORCH_MODULE(Branchy);

void check_find_unused_parameters(bool gradient_as_bucket_view) {
  const int port = testing::free_port();
  const int n = 2;
  auto results = run_ranks(n, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, n, port);
    torch::manual_seed(5);
    Branchy net;
    DdpOptions o;
    o.find_unused_parameters = true;
    o.gradient_as_bucket_view = gradient_as_bucket_view;
    DistributedDataParallel ddp(net.ptr(), pg, o);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      auto x = torch::full({2, 4}, 1.0 + rank);
      auto out = ddp.forward([&] {  // b only on rank 0; c never
        auto y = net->a->forward(x);
        return rank == 0 ? y + net->b->forward(x) : y;
      });
      out.sum().backward();
      RANK_CHECK(net->b->weight.grad().defined(), "b.weight has no gradient");
      RANK_CHECK(testing::same_on_all_ranks(*pg, net->b->weight.grad()), "b.weight grads differ");
      RANK_CHECK(testing::same_on_all_ranks(*pg, net->a->weight.grad()), "a.weight grads differ");
      // rank 0's gradient of b is 2 * x = 2 per entry: averaged over 2 ranks, 1.
      RANK_CHECK(std::abs(net->b->weight.grad()[0][0].item<float>() - 1.0f) < 1e-6,
                 "b.weight grad {}", net->b->weight.grad()[0][0].item<float>());
      RANK_CHECK(!net->c->weight.grad().defined(), "c is used by no rank: its grad stays unset");
      opt.step();
    }
    // A parameter that no rank uses in an iteration keeps the gradient it had, bucket view or not.
    const auto kept = net->b->weight.grad().clone();
    auto out = ddp.forward([&] { return net->a->forward(torch::ones({2, 4})); });
    out.sum().backward();
    RANK_CHECK(net->b->weight.grad().equal(kept), "b.weight's gradient changed while unused: {}",
               net->b->weight.grad()[0][0].item<float>());
  }, 60s);
  expect_all_ok(results);
}

TEST(Ddp, FindUnusedParametersReducesWhatSomeRanksUsed) { check_find_unused_parameters(false); }
TEST(Ddp, FindUnusedParametersWithBucketViewsKeepsAnUnusedGradient) {
  check_find_unused_parameters(true);
}

TEST(Ddp, AnUnusedParameterWithoutFindUnusedIsNamed) {
  const int port = testing::free_port();
  const int n = 2;
  auto results = run_ranks(n, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, n, port);
    Branchy net;
    DistributedDataParallel ddp(net.ptr(), pg);
    auto x = torch::ones({2, 4});
    auto out = ddp.forward([&] { return net->a->forward(x) + net->b->forward(x); });
    std::string message;
    try {
      out.sum().backward();
    } catch (const std::exception& e) {
      message = e.what();
    }
    RANK_CHECK(message.find("c.weight") != std::string::npos, "message: {}", message);
    RANK_CHECK(message.find("find_unused_parameters") != std::string::npos, "message: {}", message);
  }, 60s);
  expect_all_ok(results);
}

TEST(Ddp, JoinWithUnevenInputsFinishesAndAgrees) {
  const int port = testing::free_port();
  const int n = 3;
  auto results = run_ranks(n, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, n, port);
    auto net = testing::make_net(false);
    DistributedDataParallel ddp(net.ptr(), pg);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
    const int batches = 2 + 2 * rank;  // 2, 4 and 6 batches
    ddp.join([&] {
      for (int i = 0; i < batches; ++i) {
        auto local = testing::shard(testing::global_batch(i, 12), rank, n);
        opt.zero_grad();
        auto out = ddp.forward([&] { return net->forward(local.x); });
        torch::nn::functional::cross_entropy(out, local.y).backward();
        opt.step();
      }
    });
    for (const auto& p : net->parameters())
      RANK_CHECK(testing::same_on_all_ranks(*pg, p), "parameters differ after join");
    for (const auto& b : net->buffers())
      RANK_CHECK(testing::same_on_all_ranks(*pg, b), "buffers differ after join");
  }, 60s);
  expect_all_ok(results);
}

}  // namespace
}  // namespace dtrain
