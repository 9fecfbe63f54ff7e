// ShardedDataParallel over real processes: every stage against DDP and against one process on
// the whole batch, with SGD, momentum, Adam and AdamW; clipping; no_sync; 16-bit communication;
// a module as one unit; what each stage's unit policy keeps after backward; the model-state
// memory a counting allocator sees; refusals; a killed rank.
#include "dtrain/torch/sharded_data_parallel.h"

#include <gtest/gtest.h>

#include <climits>
#include <csignal>
#include <thread>

#include "comm/backend_registry.h"
#include "dtrain/error.h"
#include "dtrain/torch/memory_estimate.h"
#include "dtrain/torch/distributed_data_parallel.h"
#include "dtrain/torch/runtime.h"
#include "support/expect.h"
#include "support/multiproc.h"
#include "torch/torch_test_support.h"
#include "torch/unit_policy.h"

namespace dtrain {
namespace {

using namespace std::chrono_literals;
using testing::expect_all_ok;
using testing::make_group;
using testing::run_ranks;

// Three units whose sizes (144, 272, 68 parameters) are not multiples of 2 or 3: padding.
torch::nn::Sequential make_seq() {
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 4));
}

enum class Opt { kSgd, kMomentum, kAdam, kAdamW };

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Opt kind, std::vector<at::Tensor> params) {
  switch (kind) {
    case Opt::kSgd: return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1));
    case Opt::kMomentum:
      return std::make_unique<torch::optim::SGD>(params,
                                                 torch::optim::SGDOptions(0.1).momentum(0.9));
    case Opt::kAdam:
      return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01));
    case Opt::kAdamW:
      return std::make_unique<torch::optim::AdamW>(
          params, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  }
  return nullptr;
}

at::Tensor loss_of(const at::Tensor& out, const at::Tensor& y) {
  return torch::nn::functional::cross_entropy(out, y);
}

double max_difference(const std::map<std::string, at::Tensor>& full, torch::nn::Module& ref) {
  double worst = 0;
  for (const auto& p : ref.named_parameters())
    worst = std::max(worst, (full.at(p.key()) - p.value()).abs().max().item<double>());
  return worst;
}

struct Compared {
  double vs_ddp = 0;  // the largest parameter difference from DDP
  double vs_one = 0;  // and from one process on the whole batch
};

// Trains the sharded model, a DDP model and (in-process) one process on the whole batch for
// `steps` steps from the same start; returns the differences on this rank.
Compared train_and_compare(int rank, int n, int port, ShardingOptions options, Opt kind,
                           int steps, double clip = 0, const std::string& backend = "native") {
  at::set_num_threads(1);
  auto pg = make_group(rank, n, port, {.backend = backend});
  auto model = make_seq();
  auto ddp_model = make_seq();
  auto ref = make_seq();
  ShardedDataParallel sdp(model, pg, options);
  DistributedDataParallel ddp(ddp_model.ptr(), pg);
  auto opt = make_optimizer(kind, sdp.parameters());
  auto ddp_opt = make_optimizer(kind, ddp_model->parameters());
  auto ref_opt = make_optimizer(kind, ref->parameters());
  for (int step = 0; step < steps; ++step) {
    auto global = testing::global_batch(step, 12);
    auto local = testing::shard(global, rank, n);
    opt->zero_grad();
    loss_of(sdp.forward(local.x), local.y).backward();
    if (clip > 0) sdp.clip_grad_norm(clip);
    opt->step();

    ddp_opt->zero_grad();
    loss_of(ddp.forward([&] { return ddp_model->forward(local.x); }), local.y).backward();
    if (clip > 0) torch::nn::utils::clip_grad_norm_(ddp_model->parameters(), clip);
    ddp_opt->step();

    ref_opt->zero_grad();
    loss_of(ref->forward(global.x), global.y).backward();
    if (clip > 0) torch::nn::utils::clip_grad_norm_(ref->parameters(), clip);
    ref_opt->step();
  }
  auto full = sdp.full_parameters();
  for (const auto& [name, value] : full)
    RANK_CHECK(testing::same_on_all_ranks(*pg, value), "'{}' differs between ranks", name);
  return {max_difference(full, *ddp_model), max_difference(full, *ref)};
}

void check_stage(int stage, Opt kind, int n, double tolerance) {
  const int port = testing::free_port();
  auto results = run_ranks(n, [&](int rank) {
    ShardingOptions o;
    o.stage = stage;
    auto d = train_and_compare(rank, n, port, o, kind, 5);
    RANK_CHECK(d.vs_ddp <= tolerance, "stage {}: parameters differ from DDP's by {}", stage,
               d.vs_ddp);
    RANK_CHECK(d.vs_one <= 1e-5, "stage {}: parameters differ from one process by {}", stage,
               d.vs_one);
  }, 120s);
  expect_all_ok(results);
}

// Two ranks: the averages are (a + b) / 2 in both DDP and the reduce-scatter, and every
// optimizer works element by element, so the parameters are bit-equal to DDP's.
TEST(ShardedDataParallel, Stage1SgdEqualsDdpBitForBit) { check_stage(1, Opt::kSgd, 2, 0); }
TEST(ShardedDataParallel, Stage2MomentumEqualsDdpBitForBit) { check_stage(2, Opt::kMomentum, 2, 0); }
TEST(ShardedDataParallel, Stage3AdamEqualsDdpBitForBit) { check_stage(3, Opt::kAdam, 2, 0); }
TEST(ShardedDataParallel, Stage3AdamWEqualsDdpBitForBit) { check_stage(3, Opt::kAdamW, 2, 0); }
// Three ranks sum in another order than DDP's all-reduce: equal to float tolerance.
TEST(ShardedDataParallel, Stage1AdamAtThreeRanks) { check_stage(1, Opt::kAdam, 3, 1e-6); }
TEST(ShardedDataParallel, Stage2AdamWAtThreeRanks) { check_stage(2, Opt::kAdamW, 3, 1e-6); }
TEST(ShardedDataParallel, Stage3MomentumAtThreeRanks) { check_stage(3, Opt::kMomentum, 3, 1e-6); }

// A LibTorch program links every backend but gloo (src/backends: a torch wheel carries a Gloo of
// its own, which cannot share a process with Debian's): asking for it says so, in the call.
TEST(ShardedDataParallel, TheGlooBackendIsRefusedInAProgramWithLibTorch) {
  EXPECT_EQ(backends::built_backend("gloo"), nullptr);  // asking what is built never throws
  try {
    backends::find_backend("gloo");
    FAIL() << "a LibTorch program found the gloo backend";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("backend gloo is not built into this"), std::string::npos)
        << e.what();
  }
}

TEST(ShardedDataParallel, ClippingByTheGlobalNormMatchesTheWholeModel) {
  const int port = testing::free_port();
  auto results = run_ranks(2, [&](int rank) {
    ShardingOptions o;
    o.stage = 3;
    // max_norm 0.05 clips every step (the gradients' norm is ~1).
    auto d = train_and_compare(rank, 2, port, o, Opt::kMomentum, 4, 0.05);
    RANK_CHECK(d.vs_ddp <= 1e-6 && d.vs_one <= 1e-5, "clipped: {} from DDP, {} from one process",
               d.vs_ddp, d.vs_one);
  }, 120s);
  expect_all_ok(results);
}

TEST(ShardedDataParallel, SixteenBitCommunicationStaysClose) {
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    const int port = testing::free_port();
    auto results = run_ranks(2, [&](int rank) {
      ShardingOptions o;
      o.stage = 3;
      o.communication_dtype = dtype;
      auto d = train_and_compare(rank, 2, port, o, Opt::kAdam, 4);
      // bf16 keeps 8 bits of mantissa: the parameters computed with are rounded to ~0.4%.
      RANK_CHECK(d.vs_one <= 2e-2, "{}: {} from one process", c10::toString(dtype), d.vs_one);
      RANK_CHECK(d.vs_one > 0, "{}: exactly equal: the 16-bit path was not taken",
                 c10::toString(dtype));
    }, 120s);
    expect_all_ok(results);
  }
}

TEST(ShardedDataParallel, NoSyncAccumulationEqualsTheLargerBatch) {
  for (int stage : {1, 2, 3}) {
    const int port = testing::free_port();
    auto results = run_ranks(2, [&](int rank) {
      at::set_num_threads(1);
      auto pg = make_group(rank, 2, port);
      auto model = make_seq();
      auto ref = make_seq();
      ShardedDataParallel sdp(model, pg, {.stage = stage});
      torch::optim::SGD opt(sdp.parameters(), 0.1);
      torch::optim::SGD ref_opt(ref->parameters(), 0.1);
      for (int step = 0; step < 3; ++step) {
        opt.zero_grad();
        ref_opt.zero_grad();
        for (int micro = 0; micro < 3; ++micro) {  // two local passes, then one that reduces
          auto global = testing::global_batch(10 * step + micro, 8);
          auto local = testing::shard(global, rank, 2);
          if (micro < 2) {
            auto guard = sdp.no_sync();
            loss_of(sdp.forward(local.x), local.y).backward();
          } else {
            loss_of(sdp.forward(local.x), local.y).backward();
          }
          loss_of(ref->forward(global.x), global.y).backward();
        }
        opt.step();
        ref_opt.step();
      }
      double diff = max_difference(sdp.full_parameters(), *ref);
      RANK_CHECK(diff < 1e-5, "stage {}: {} from one process", stage, diff);
    }, 120s);
    expect_all_ok(results);
  }
}

// A module that is not a Sequential is one unit, run through forward(fn); with batch norm in
// eval mode and its buffers broadcast from rank 0.
TEST(ShardedDataParallel, AModuleAsOneUnitMatchesOneProcess) {
  const int port = testing::free_port();
  auto results = run_ranks(2, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, 2, port);
    auto net = testing::make_net(/*bn_eval=*/true);
    auto ref = testing::make_net(/*bn_eval=*/true);
    ShardedDataParallel sdp(net.ptr(), pg, {.stage = 3});
    RANK_CHECK(sdp.units().size() == 1, "{} units", sdp.units().size());
    torch::optim::Adam opt(sdp.parameters(), 0.01);
    torch::optim::Adam ref_opt(ref->parameters(), 0.01);
    for (int step = 0; step < 4; ++step) {
      auto global = testing::global_batch(step, 12);
      auto local = testing::shard(global, rank, 2);
      opt.zero_grad();
      loss_of(sdp.forward([&] { return net->forward(local.x); }), local.y).backward();
      opt.step();
      ref_opt.zero_grad();
      loss_of(ref->forward(global.x), global.y).backward();
      ref_opt.step();
    }
    // Between steps the stage-3 parameters hold no memory; gather_parameters() fills them.
    RANK_CHECK(net->fc1->weight.numel() == 0, "fc1.weight has {} elements while released",
               net->fc1->weight.numel());
    sdp.gather_parameters();
    double diff = testing::max_difference(*net, *ref);
    RANK_CHECK(diff < 1e-5, "{} from one process", diff);
    // Evaluation without gradients releases as it goes and changes nothing.
    {
      torch::NoGradGuard no_grad;
      auto global = testing::global_batch(99, 4);
      auto out = sdp.forward([&] { return net->forward(global.x); });
      RANK_CHECK((out - ref->forward(global.x)).abs().max().item<double>() < 1e-5,
                 "evaluation differs");
    }
  }, 120s);
  expect_all_ok(results);
}

TEST(ShardedDataParallel, UnitsFollowTheSequentialsChildren) {
  const int port = testing::free_port();
  auto results = run_ranks(2, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, 2, port);
    ShardedDataParallel each(make_seq(), pg, {.stage = 3});
    auto units = each.units();
    RANK_CHECK(units.size() == 3, "{} units", units.size());
    RANK_CHECK(units[0].parameter_names == std::vector<std::string>({"0.weight", "0.bias"}),
               "unit 0 holds {}", fmt::join(units[0].parameter_names, ","));
    RANK_CHECK(units[0].numel == 144 && units[0].shard_numel == 72, "unit 0: {} / {}",
               units[0].numel, units[0].shard_numel);
    RANK_CHECK(units[2].numel == 68 && units[2].shard_numel == 34, "unit 2: {} / {}",
               units[2].numel, units[2].shard_numel);
    ShardedDataParallel grouped(make_seq(), pg, {.stage = 3, .min_unit_parameters = 300});
    RANK_CHECK(grouped.units().size() == 2, "{} units with min_unit_parameters 300",
               grouped.units().size());
  }, 60s);
  expect_all_ok(results);
}

// The stage is read once as each unit's policy. After a backward, stage 1 keeps the module's
// whole gradients (zeroed once reduced), stage 2 only the shards' gradients, and stage 3 neither
// whole gradients nor whole parameters.
TEST(ShardedDataParallel, EachStageKeepsWhatItsUnitPolicySays) {
  const UnitPolicy one = unit_policy({.stage = 1});
  const UnitPolicy two = unit_policy({.stage = 2});
  const UnitPolicy three = unit_policy({.stage = 3, .prefetch = false});
  EXPECT_FALSE(one.shard_gradients);
  EXPECT_FALSE(one.reshard_parameters);
  EXPECT_TRUE(one.prefetch);
  EXPECT_TRUE(two.shard_gradients);
  EXPECT_FALSE(two.reshard_parameters);
  EXPECT_TRUE(three.shard_gradients);
  EXPECT_TRUE(three.reshard_parameters);
  EXPECT_FALSE(three.prefetch);

  const int port = testing::free_port();
  auto results = run_ranks(2, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, 2, port);
    for (int stage : {1, 2, 3}) {
      const UnitPolicy policy = unit_policy({.stage = stage});
      auto model = make_seq();
      ShardedDataParallel sdp(model, pg, {.stage = stage});
      auto local = testing::shard(testing::global_batch(0, 8), rank, 2);
      loss_of(sdp.forward(local.x), local.y).backward();
      for (const auto& p : model->named_parameters()) {
        const bool whole_gradient = p.value().grad().defined();
        RANK_CHECK(whole_gradient == !policy.shard_gradients, "stage {}: '{}' has {} gradient",
                   stage, p.key(), whole_gradient ? "a whole" : "no");
        RANK_CHECK((p.value().numel() == 0) == policy.reshard_parameters,
                   "stage {}: '{}' has {} elements after backward", stage, p.key(),
                   p.value().numel());
      }
      for (const auto& shard : sdp.parameters())
        RANK_CHECK(shard.grad().defined(), "stage {}: a shard has no gradient", stage);
    }
  }, 120s);
  expect_all_ok(results);
}

// The model states a counting allocator sees (jemalloc's), against the formulas and against
// `dtrain estimate`: at stage 3 with Adam, 16 bytes per parameter / N, plus during a step the
// units held at once; stages 1 and 2 as the estimator says, within 10%.
void check_memory(int stage, int n) {
  const int port = testing::free_port();
  auto results = run_ranks(n, [&](int rank) {
    at::set_num_threads(1);
    if (heap_allocated_memory() < 0) ::_exit(5);  // no jemalloc: nothing to count with
    auto pg = make_group(rank, n, port);
    const int64_t width = 256, layers = 8;
    const int64_t params = layers * width * width;
    const int64_t unit = 4 * width * width;
    // The transport keeps buffers of messages that came early (up to 16 MiB, as timing decides),
    // and the allocator's counter sees them: the first round warms them, and of three more the
    // least is taken (a leak of model states would show in every round).
    int64_t states = INT64_MAX, peak = 0;
    for (int round = 0; round < 4; ++round) {
      const int64_t before = heap_allocated_memory();
      torch::nn::Sequential model;
      torch::manual_seed(3);
      // No biases: every shard is then a power of two bytes, which jemalloc hands out exactly
      // (it rounds other large sizes up to a quarter of a power of two, and counts that).
      for (int i = 0; i < layers; ++i)
        model->push_back(torch::nn::Linear(torch::nn::LinearOptions(width, width).bias(false)));
      ShardedDataParallel sdp(model, pg, {.stage = stage});
      torch::optim::Adam opt(sdp.parameters(), 1e-3);
      auto step = [&] {
        auto x = torch::randn({2, width});
        opt.zero_grad();
        sdp.forward(x).pow(2).mean().backward();
        opt.step();
      };
      step();
      step();
      const int64_t kept = heap_allocated_memory() - before;
      reset_thread_peak_memory();
      step();
      if (round > 0 && kept < states) {
        states = kept;
        peak = kept + thread_peak_memory();
      }
    }
    torch::nn::Sequential twin;  // the model as a user would hand it to the estimator
    for (int i = 0; i < layers; ++i)
      twin->push_back(torch::nn::Linear(torch::nn::LinearOptions(width, width).bias(false)));
    const auto e = estimate_memory(*twin, {.optimizer = "adam", .world_size = n,
                                           .layout = "zero" + std::to_string(stage)});
    RANK_CHECK(e.parameters > 0 && twin->parameters().size() == static_cast<size_t>(layers),
               "estimated from {} parameters", params);
    const int64_t estimated_states = e.parameters + e.gradients + e.optimizer;
    std::printf("stage %d, rank %d of %d: model states %lld bytes (estimate %lld), peak in a step "
                "%lld (estimate %lld)\n",
                stage, rank, n, static_cast<long long>(states),
                static_cast<long long>(estimated_states), static_cast<long long>(peak),
                static_cast<long long>(e.model_states()));
    RANK_CHECK(std::abs(estimated_states - states) <= 0.1 * states,
               "stage {}: model states {} bytes, estimated {}", stage, states, estimated_states);
    RANK_CHECK(std::abs(e.model_states() - peak) <= 0.1 * peak,
               "stage {}: peak {} bytes, estimated {}", stage, peak, e.model_states());
    if (stage == 3) {
      const double bound = 16.0 * params / n;
      RANK_CHECK(states <= bound * 1.01 + 65536, "model states {} bytes > 16 x {} / {} = {}",
                 states, params, n, bound);
      // Held at once in backward: the unit computing and the one prefetched (2), its whole
      // gradient and the new gradient autograd adds into it (2), and the reduction in flight
      // with its output (1.5 at N = 2); jemalloc's counter is accurate to ~100 KB.
      RANK_CHECK(peak <= bound + 6 * unit + 200 * 1024, "peak {} bytes > {} + 6 units of {} bytes",
                 peak, bound, unit);
    }
  }, 120s);
  for (const auto& r : results)
    if (r.exit_code == 5) GTEST_SKIP() << "the tests were not linked with jemalloc";
  expect_all_ok(results);
}

TEST(ShardedDataParallel, Stage3ModelStatesAreSixteenBytesPerParameterOverN) {
  for (int n : {1, 2, 4}) check_memory(3, n);
}
TEST(ShardedDataParallel, Stages1And2ModelStatesAreAsEstimated) {
  check_memory(1, 2);
  check_memory(2, 2);
}

TEST(ShardedDataParallel, DifferentModelsAndBadOptionsAreRefusedOnEveryRank) {
  const int port = testing::free_port();
  auto results = run_ranks(2, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, 2, port);
    auto expect_refused = [&](const std::function<void()>& make, const std::string& text) {
      try {
        make();
      } catch (const InvalidArgumentError& e) {
        RANK_CHECK(std::string(e.what()).find(text) != std::string::npos, "'{}' lacks '{}'",
                   e.what(), text);
        return;
      }
      throw std::runtime_error("accepted: " + text);
    };
    expect_refused([&] {
      auto m = rank == 1 ? torch::nn::Sequential(torch::nn::Linear(8, 5)) : make_seq();
      ShardedDataParallel sdp(m, pg);
    }, "ranks [1] have a model that differs from rank 0's");
    expect_refused([&] {
      auto m = make_seq();
      if (rank == 0) m->ptr(0)->as<torch::nn::Linear>()->bias.set_requires_grad(false);
      ShardedDataParallel sdp(m, pg);
    }, rank == 0 ? "parameter '0.bias' does not require grad" : "ranks [0] refused the model");
    // One device for the whole model (the meta device stands for a GPU this machine may lack).
    expect_refused([&] {
      auto m = make_seq();
      m->push_back(testing::OnMeta());
      ShardedDataParallel sdp(m, pg);
    }, "is on meta, others on cpu: ShardedDataParallel keeps a model on one device");
    expect_refused([&] { ShardedDataParallel sdp(make_seq(), pg, {.stage = 4}); },
                   "stage 4 is not 1, 2 or 3");
    expect_refused([&] {
      ShardedDataParallel sdp(make_seq(), pg, {.communication_dtype = at::kInt});
    }, "communication_dtype Int is not float, bfloat16 or half");
  }, 60s);
  expect_all_ok(results);
}

// A rank that dies in the middle of training: the others fail at their next collective with an
// error naming it, well before the group's timeout.
TEST(ShardedDataParallel, AKilledRankFailsTheOthersNamingIt) {
  const int port = testing::free_port();
  auto results = run_ranks(3, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, 3, port, {}, 30s);
    auto model = make_seq();
    ShardedDataParallel sdp(model, pg, {.stage = 3});
    torch::optim::Adam opt(sdp.parameters(), 0.01);
    auto b = testing::global_batch(0, 6);
    for (int step = 0; step < 3; ++step) {
      if (step == 2 && rank == 2) ::raise(SIGKILL);
      const auto start = std::chrono::steady_clock::now();
      try {
        opt.zero_grad();
        loss_of(sdp.forward(b.x), b.y).backward();
        opt.step();
      } catch (const std::exception& e) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const std::string text = e.what();
        RANK_CHECK(step == 2, "failed at step {}: {}", step, text);
        RANK_CHECK(text.find("rank 2") != std::string::npos, "the error does not name rank 2: {}",
                   text);
        RANK_CHECK(s < 15, "failed after {:.1f} s", s);
        ::_exit(3);
      }
    }
    throw std::runtime_error("training went on without rank 2");
  }, 60s);
  EXPECT_EQ(results[0].exit_code, 3);
  EXPECT_EQ(results[1].exit_code, 3);
  EXPECT_EQ(results[2].signal, SIGKILL);
}

}  // namespace
}  // namespace dtrain
