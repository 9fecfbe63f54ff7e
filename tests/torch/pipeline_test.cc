// The pipeline runner over real processes: after one step of every schedule on 2-4 ranks and 1, 3
// or 8 micro-batches, each stage's gradients equal the unsplit model's on one process; batch
// shapes that change; pipeline x data parallel; forward-only evaluation; a killed stage and
// mismatched options named on every rank.
#include "dtrain/torch/pipeline.h"
#include "dtrain/torch/sharded_data_parallel.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <thread>

#include <torch/torch.h>

#include "dtrain/error.h"
#include "dtrain/parallel_layout.h"
#include "dtrain/torch/pipeline_checkpoint.h"
#include "dtrain/torch/tensor_view.h"
#include "support/expect.h"
#include "support/group.h"
#include "support/multiproc.h"
#include "torch/torch_test_support.h"

namespace dtrain {
namespace {

using namespace std::chrono_literals;
using testing::expect_all_ok;
using testing::make_group;
using testing::run_ranks;

// 8 Linear layers of changing widths with Tanh between them: up to 8 stages, and activations of
// different shapes at each cut. Built from the same seed on every rank.
torch::nn::Sequential make_model() {
  torch::manual_seed(42);
  const std::vector<int64_t> widths = {6, 12, 9, 16, 7, 10, 8, 11, 4};
  torch::nn::Sequential model;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    model->push_back(torch::nn::Linear(widths[i], widths[i + 1]));
    if (i + 2 < widths.size()) model->push_back(torch::nn::Tanh());
  }
  return model;
}

struct Batch {
  at::Tensor x, y;
};
Batch make_batch(int seed, int64_t rows) {
  torch::manual_seed(seed);
  return {torch::randn({rows, 6}), torch::randint(0, 4, {rows}, torch::kLong)};
}

at::Tensor cross_entropy(const at::Tensor& out, const at::Tensor& y) {
  return torch::nn::functional::cross_entropy(out, y);
}

// This rank's stages of the model cut into p * v stages (balanced by parameters).
std::vector<torch::nn::Sequential> my_stages(const torch::nn::Sequential& model, int p, int v,
                                             int rank) {
  auto cuts = balance_by_parameters(model, p * v);
  std::vector<torch::nn::Sequential> out;
  for (int s = rank; s < p * v; s += p) out.push_back(slice(model, cuts[s], cuts[s + 1]));
  return out;
}

// The gradients of the whole model on one process, by parameter name.
std::map<std::string, at::Tensor> reference_grads(const Batch& b, at::Tensor* loss = nullptr) {
  auto ref = make_model();
  auto l = cross_entropy(ref->forward(b.x), b.y);
  l.backward();
  if (loss != nullptr) *loss = l.detach();
  std::map<std::string, at::Tensor> out;
  for (const auto& p : ref->named_parameters()) out[p.key()] = p.value().grad().clone();
  return out;
}

// Every parameter this rank holds has the reference's gradient (relative to its largest entry).
void check_grads(const std::vector<torch::nn::Sequential>& stages,
                 const std::map<std::string, at::Tensor>& ref, const std::string& what) {
  int checked = 0;
  for (const auto& stage : stages) {
    for (const auto& p : stage->named_parameters()) {
      RANK_CHECK(p.value().grad().defined(), "{}: {} has no gradient", what, p.key());
      const at::Tensor& want = ref.at(p.key());
      const double diff = (p.value().grad() - want).abs().max().item<double>();
      const double scale = std::max(want.abs().max().item<double>(), 1e-6);
      RANK_CHECK(diff <= 1e-5 * scale, "{}: gradient of {} differs by {} (largest entry {})", what,
                 p.key(), diff, scale);
      ++checked;
    }
  }
  RANK_CHECK(checked > 0, "{}: this rank holds no parameters", what);
}

// Runs a step that must fail: checks that it failed within [min_s, max_s] seconds with an error
// holding every one of `names`, says so, and ends the rank with exit code 3.
[[noreturn]] void step_must_fail(Pipeline& pipe, const Batch& b, int rank, double min_s,
                                 double max_s, const std::vector<std::string>& names) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    pipe.step(b.x, b.y, cross_entropy);
  } catch (const Error& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string text = e.what();
    RANK_CHECK(s >= min_s && s <= max_s, "failed after {:.1f} s, not in [{}, {}] s: {}", s, min_s,
               max_s, text);
    for (const auto& name : names)
      RANK_CHECK(text.find(name) != std::string::npos, "the error does not say '{}': {}", name, text);
    std::fprintf(stderr, "[rank %d] failed as expected after %.2f s: %s\n", rank, s, text.c_str());
    std::fflush(stderr);
    ::_exit(3);
  }
  throw std::runtime_error("the step that had to fail succeeded");
}

void check_schedule(const std::string& name, int p, int v) {
  const int port = testing::free_port();
  auto results = run_ranks(p, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, p, port);
    for (int m : {1, 3, 8}) {
      const std::string what = fmt::format("{} p={} v={} m={}", name, p, v, m);
      auto model = make_model();
      auto stages = my_stages(model, p, v, rank);
      Pipeline pipe(stages, pg, {.schedule = name, .microbatches = m, .virtual_stages = v});
      const Batch b = make_batch(7, 16);
      at::Tensor loss = pipe.step(b.x, b.y, cross_entropy);
      at::Tensor ref_loss;
      auto ref = reference_grads(b, &ref_loss);
      check_grads(stages, ref, what);
      if (pipe.holds_last_stage()) {
        RANK_CHECK(loss.defined(), "{}: no loss on the last stage", what);
        RANK_CHECK(std::abs(loss.item<double>() - ref_loss.item<double>()) < 1e-5, "{}: loss {} vs {}",
                   what, loss.item<double>(), ref_loss.item<double>());
      } else {
        RANK_CHECK(!loss.defined(), "{}: a loss off the last stage", what);
      }
    }
  }, 120s);
  expect_all_ok(results);
}

class EverySchedule : public ::testing::TestWithParam<std::string> {};

TEST_P(EverySchedule, GradientsEqualTheUnsplitModelsOn2To4Ranks) {
  const std::string name = GetParam();
  const int v = name == "interleaved-1f1b" ? 2 : 1;
  for (int p = 2; p <= 4; ++p) {
    SCOPED_TRACE(fmt::format("{} ranks", p));
    check_schedule(name, p, v);
  }
}

INSTANTIATE_TEST_SUITE_P(Pipeline, EverySchedule,
                         ::testing::Values("gpipe", "1f1b", "interleaved-1f1b", "zb-h1"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(Pipeline, BatchShapesMayChangeFromStepToStep) {
  const int port = testing::free_port();
  auto results = run_ranks(3, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, 3, port);
    auto model = make_model();
    auto stages = my_stages(model, 3, 1, rank);
    Pipeline pipe(stages, pg, {.schedule = "1f1b", .microbatches = 3});
    for (int64_t rows : {16, 10, 3, 7}) {  // 7 rows: micro-batches of 3, 2 and 2
      for (auto& s : stages) s->zero_grad();
      const Batch b = make_batch(static_cast<int>(rows), rows);
      pipe.step(b.x, b.y, cross_entropy);
      check_grads(stages, reference_grads(b), fmt::format("{} rows", rows));
    }
    // Forward only (evaluation): the unsplit model's output, on the last stage.
    const Batch e = make_batch(99, 5);
    at::Tensor out = pipe.forward(e.x);
    if (pipe.holds_last_stage()) {
      torch::NoGradGuard no_grad;
      const double diff = (out - make_model()->forward(e.x)).abs().max().item<double>();
      RANK_CHECK(diff < 1e-6, "forward-only output differs by {}", diff);
    } else {
      RANK_CHECK(!out.defined(), "an output off the last stage");
    }
    RANK_CHECK(pipe.stats().step == 4, "{} steps counted", pipe.stats().step);
  }, 90s);
  expect_all_ok(results);
}

TEST(Pipeline, TimesDataParallelReplicasEqualsOneProcessOnTheWholeBatch) {
  // 4 ranks = 2 stages x 2 replicas; each replica trains on half of the batch.
  const int port = testing::free_port();
  auto results = run_ranks(4, [&](int rank) {
    at::set_num_threads(1);
    auto world = make_group(rank, 4, port);
    ParallelLayout layout(world, {.pipeline_stages = 2});
    RANK_CHECK(layout.stage() == rank / 2 && layout.replica() == rank % 2, "{}", layout.describe());
    auto model = make_model();
    auto stages = my_stages(model, 2, 1, layout.stage());
    Pipeline pipe(stages, layout.pipeline_group(), {.schedule = "zb-h1", .microbatches = 4},
                  layout.data_group());
    torch::optim::SGD opt(pipe.parameters(), torch::optim::SGDOptions(0.1));
    auto ref = make_model();
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 3; ++step) {
      const Batch whole = make_batch(100 + step, 16);
      const int64_t half = 8 * layout.replica();
      opt.zero_grad();
      pipe.step(whole.x.slice(0, half, half + 8), whole.y.slice(0, half, half + 8), cross_entropy);
      opt.step();
      ref_opt.zero_grad();
      cross_entropy(ref->forward(whole.x), whole.y).backward();
      ref_opt.step();
    }
    auto want = ref->named_parameters();
    for (const auto& stage : stages) {
      for (const auto& p : stage->named_parameters()) {
        const double diff = (p.value() - want[p.key()]).abs().max().item<double>();
        RANK_CHECK(diff < 1e-5, "after 3 steps {} differs from one process by {}", p.key(), diff);
        // The replicas of a stage hold the same bits.
        at::Tensor mine = p.value().detach().clone();
        at::Tensor both = torch::empty({2, mine.numel()});
        layout.data_group()->allgather(view_of(both), view_of(mine))->wait();
        RANK_CHECK(torch::equal(both[0], both[1]), "replicas differ in {}", p.key());
      }
    }
  }, 90s);
  expect_all_ok(results);
}

// The same grid with ZeRO-1 over each stage's replicas instead of their all-reduce: Adam's
// state is split between the replicas, the parameters are those of one process.
TEST(Pipeline, TimesShardedReplicasEqualsOneProcessOnTheWholeBatch) {
  for (int zero_stage : {1, 2}) {
    const int port = testing::free_port();
    auto results = run_ranks(4, [&](int rank) {
      at::set_num_threads(1);
      auto world = make_group(rank, 4, port);
      ParallelLayout layout(world, {.pipeline_stages = 2});
      auto model = make_model();
      auto stages = my_stages(model, 2, 1, layout.stage());
      Pipeline pipe(stages, layout.pipeline_group(), {.schedule = "1f1b", .microbatches = 4});
      ShardedDataParallel zero(stages[0], layout.data_group(), {.stage = zero_stage});
      torch::optim::Adam opt(zero.parameters(), 0.01);
      auto ref = make_model();
      torch::optim::Adam ref_opt(ref->parameters(), 0.01);
      for (int step = 0; step < 3; ++step) {
        const Batch whole = make_batch(200 + step, 16);
        const int64_t half = 8 * layout.replica();
        opt.zero_grad();
        pipe.step(whole.x.slice(0, half, half + 8), whole.y.slice(0, half, half + 8),
                  cross_entropy);
        zero.reduce_gradients();
        opt.step();
        zero.gather_parameters();
        ref_opt.zero_grad();
        cross_entropy(ref->forward(whole.x), whole.y).backward();
        ref_opt.step();
      }
      auto want = ref->named_parameters();
      for (const auto& p : stages[0]->named_parameters()) {
        const double diff = (p.value() - want[p.key()]).abs().max().item<double>();
        RANK_CHECK(diff < 1e-5, "ZeRO-{}: after 3 steps {} differs from one process by {}",
                   zero_stage, p.key(), diff);
      }
    }, 90s);
    expect_all_ok(results);
  }
}

TEST(Pipeline, AKilledStageFailsEveryRankNamingIt) {
  const int port = testing::free_port();
  const int p = 4;
  auto results = run_ranks(p, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, p, port, {}, 60s);  // a long limit: failing fast must not need it
    auto model = make_model();
    auto stages = my_stages(model, p, 1, rank);
    Pipeline pipe(stages, pg, {.schedule = "1f1b", .microbatches = 4});
    const Batch b = make_batch(1, 16);
    pipe.step(b.x, b.y, cross_entropy);
    if (rank == 2) ::raise(SIGKILL);
    step_must_fail(pipe, b, rank, 0, 15, {"rank 2", "step 1"});
  }, 60s);
  for (int r = 0; r < p; ++r) {
    if (r == 2) {
      EXPECT_EQ(results[r].signal, SIGKILL);
    } else {
      EXPECT_FALSE(results[r].timed_out) << "rank " << r;
      EXPECT_EQ(results[r].exit_code, 3) << "rank " << r;
    }
  }
}

TEST(Pipeline, AStageThatStopsAnsweringFailsItsPeersWithinTheTimeout) {
  const int port = testing::free_port();
  auto results = run_ranks(3, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, 3, port);
    auto model = make_model();
    auto stages = my_stages(model, 3, 1, rank);
    Pipeline pipe(stages, pg, {.schedule = "1f1b", .microbatches = 3, .timeout = 2s});
    const Batch b = make_batch(1, 12);
    pipe.step(b.x, b.y, cross_entropy);
    if (rank == 1) {  // alive, connected, silent: a hung stage
      std::this_thread::sleep_for(6s);
      ::_exit(4);
    }
    step_must_fail(pipe, b, rank, 1.5, 4.5, {"from rank 1", "of 1f1b (recv "});
  }, 60s);
  EXPECT_EQ(results[0].exit_code, 3);
  EXPECT_EQ(results[1].exit_code, 4);
  EXPECT_EQ(results[2].exit_code, 3);
}

TEST(Pipeline, MismatchedOptionsAndBadInputAreNamed) {
  const int port = testing::free_port();
  auto results = run_ranks(2, [&](int rank) {
    at::set_num_threads(1);
    auto pg = make_group(rank, 2, port);
    auto model = make_model();
    auto stages = my_stages(model, 2, 1, rank);
    try {
      Pipeline bad(stages, pg, {.schedule = "1f1b", .microbatches = rank == 0 ? 4 : 8});
      throw std::runtime_error("different micro-batch counts were accepted");
    } catch (const InvalidArgumentError& e) {
      RANK_CHECK(std::string(e.what()).find("give every rank the same PipelineOptions") !=
                     std::string::npos,
                 "{}", e.what());
    }
    // A rank that cannot accept its stages says why; the other is told at once, not at its timeout.
    try {
      std::vector<torch::nn::Sequential> two = {stages[0], stages[0]};
      Pipeline bad(rank == 1 ? two : stages, pg, {.schedule = "1f1b", .microbatches = 4});
      throw std::runtime_error("two stage modules for one stage were accepted");
    } catch (const InvalidArgumentError& e) {
      const std::string text = e.what();
      RANK_CHECK(text.find(rank == 1 ? "rank 1 was given 2 stage modules for 1 virtual stage"
                                     : "rank 1 of the pipeline refused its stages") !=
                     std::string::npos,
                 "{}", text);
    }
    // A parameter shared by two modules of a stage cannot have its weight gradient split.
    torch::nn::Linear tied(6, 6);
    torch::nn::Sequential shared(tied, torch::nn::Tanh(), tied);
    try {
      Pipeline bad({rank == 0 ? shared : stages[0]}, pg, {.schedule = "zb-h1", .microbatches = 4});
      throw std::runtime_error("a tied parameter was accepted by zb-h1");
    } catch (const InvalidArgumentError& e) {
      const std::string text = e.what();
      RANK_CHECK(text.find(rank == 0 ? "shares a parameter between its modules 0 and 2"
                                     : "rank 0 of the pipeline refused") != std::string::npos,
                 "{}", text);
    }
    // A stage computes on one device: parameters on two are refused (the meta device stands
    // for a GPU, which this machine may lack).
    torch::nn::Sequential split(torch::nn::Linear(6, 6), testing::OnMeta());
    try {
      Pipeline bad({rank == 1 ? split : stages[0]}, pg, {.schedule = "1f1b", .microbatches = 4});
      throw std::runtime_error("a stage on two devices was accepted");
    } catch (const InvalidArgumentError& e) {
      const std::string text = e.what();
      RANK_CHECK(text.find(rank == 1 ? "stage 1 has parameters on cpu and on meta: a stage "
                                       "computes on one device"
                                     : "rank 1 of the pipeline refused") != std::string::npos,
                 "{}", text);
    }
    Pipeline pipe(stages, pg, {.schedule = "gpipe", .microbatches = 4});
    // Too few rows for the micro-batches: refused where the batch is read, and the other rank
    // is told at once.
    const Batch small = make_batch(3, 3);
    try {
      pipe.step(small.x, small.y, cross_entropy);
      throw std::runtime_error("3 rows for 4 micro-batches were accepted");
    } catch (const Error& e) {
      const std::string text = e.what();
      RANK_CHECK(text.find("has 3 rows: it cannot make 4 micro-batches") != std::string::npos, "{}", text);
    }
  }, 60s);
  expect_all_ok(results);
}

TEST(PipelineCheckpoint, AStageKilledMidSaveResumesEveryStageFromTheStepBefore) {
  const std::string dir = ::testing::TempDir() + "/pipeline_kill_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  // Steps 10 and 20 saved by both stages; at step 30 rank 1 is killed in the middle of its save
  // (after its first file), while rank 0's completes.
  const int port = testing::free_port();
  auto first = run_ranks(2, [&](int rank) {
    at::set_num_threads(1);
    auto world = make_group(rank, 2, port);
    ParallelLayout layout(world, {.pipeline_stages = 2});
    auto model = make_model();
    auto stage = my_stages(model, 2, 1, rank)[0];
    torch::optim::SGD opt(stage->parameters(), torch::optim::SGDOptions(0.1));
    CheckpointOptions o{.dir = dir, .keep = 3, .async = false};
    if (rank == 1)
      o.after_file = [&](const std::string& path) {
        if (path.find("step-000030") != std::string::npos) ::raise(SIGKILL);
      };
    PipelineCheckpoint ckpt(o, layout);
    for (int64_t step : {10, 20, 30}) {
      {
        torch::NoGradGuard no_grad;
        for (auto& p : stage->parameters()) p.fill_(static_cast<double>(step));
      }
      world->barrier()->wait();
      ckpt.save(*stage, &opt, {.step = step});
    }
  }, 60s);
  EXPECT_TRUE(first[0].ok());
  EXPECT_EQ(first[1].signal, SIGKILL);
  ASSERT_TRUE(std::filesystem::exists(dir + "/pipeline-0-of-2/step-000030"));
  ASSERT_FALSE(std::filesystem::exists(dir + "/pipeline-1-of-2/step-000030"));

  const int port2 = testing::free_port();
  auto second = run_ranks(2, [&](int rank) {
    at::set_num_threads(1);
    auto world = make_group(rank, 2, port2);
    ParallelLayout layout(world, {.pipeline_stages = 2});
    auto model = make_model();
    auto stage = my_stages(model, 2, 1, rank)[0];
    torch::optim::SGD opt(stage->parameters(), torch::optim::SGDOptions(0.1));
    PipelineCheckpoint ckpt({.dir = dir, .keep = 3}, layout);
    auto loaded = ckpt.load_latest(*stage, &opt);
    RANK_CHECK(loaded.has_value(), "nothing loaded");
    RANK_CHECK(loaded->progress.step == 20, "resumed from step {}", loaded->progress.step);
    for (const auto& p : stage->parameters())
      RANK_CHECK(p.eq(20).all().item<bool>(), "the parameters are not step 20's");
  }, 60s);
  expect_all_ok(second);
  std::filesystem::remove_all(dir);
}

TEST(Pipeline, BalanceByParametersCutsTheModelIntoSlicesThatKeepItsNames) {
  auto model = make_model();
  auto cuts = balance_by_parameters(model, 4);
  EXPECT_EQ(cuts.front(), 0u);
  EXPECT_EQ(cuts.back(), model->size());
  auto stage = slice(model, cuts[1], cuts[2]);
  auto whole = model->named_parameters();
  ASSERT_GT(stage->named_parameters().size(), 0u);
  for (const auto& p : stage->named_parameters()) {
    // "4.weight" in the stage is "4.weight" in the model, and the same tensor.
    ASSERT_NE(whole.find(p.key()), nullptr) << p.key() << ": a slice keeps the model's names";
    EXPECT_TRUE(p.value().is_same(whole[p.key()])) << p.key() << ": a slice shares the modules";
    const size_t index = std::stoul(p.key().substr(0, p.key().find('.')));
    EXPECT_GE(index, cuts[1]);
    EXPECT_LT(index, cuts[2]);
  }
  auto timed = balance_by_time(model, 3, torch::randn({32, 6}), 3);
  EXPECT_EQ(timed.size(), 4u);
}

}  // namespace
}  // namespace dtrain
