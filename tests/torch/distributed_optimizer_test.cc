// DistributedOptimizer over real processes: equality with one process on the whole batch,
// backward_passes_per_step, fp16 compression, and the broadcast helpers (and the digest that
// checks them).
#include "dtrain/torch/distributed_optimizer.h"

#include <gtest/gtest.h>

#include "dtrain/error.h"
#include "dtrain/torch/broadcast.h"
#include "support/expect.h"
#include "support/multiproc.h"
#include "torch/torch_test_support.h"

namespace dtrain {
namespace {

using namespace std::chrono_literals;
using testing::expect_all_ok;
using testing::make_group;
using testing::run_ranks;

// N ranks with B/N samples each (passes backward passes per step) vs one process with B.
void check_matches_one_process(int n, int passes, Compression compression, double tolerance) {
  const int port = testing::free_port();
  auto results = run_ranks(
      n,
      [&](int rank) {
        at::set_num_threads(1);
        auto pg = make_group(rank, n, port);
        auto net = testing::make_net(/*bn_eval=*/true);
        auto ref = testing::make_net(/*bn_eval=*/true);
        if (rank != 0) {  // start apart: broadcast_parameters must bring rank 0's weights
          torch::NoGradGuard no_grad;
          for (auto& p : net->parameters()) p.add_(1.0);
        }
        broadcast_parameters(*net, *pg, 0);
        auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(),
                                                       torch::optim::SGDOptions(0.1).momentum(0.9));
        DistributedOptimizerOptions o;
        o.backward_passes_per_step = passes;
        o.compression = compression;
        o.fusion_threshold_bytes = 256;  // several fused buffers
        DistributedOptimizer opt(sgd, *net, pg, o);
        torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
        for (int step = 0; step < 5; ++step) {
          opt.zero_grad();
          ref_opt.zero_grad();
          for (int pass = 0; pass < passes; ++pass) {
            auto global = testing::global_batch(10 * step + pass, 12);
            auto local = testing::shard(global, rank, n);
            torch::nn::functional::cross_entropy(net->forward(local.x), local.y).backward();
            torch::nn::functional::cross_entropy(ref->forward(global.x), global.y).backward();
          }
          opt.step();
          ref_opt.step();
        }
        double diff = testing::max_difference(*net, *ref);
        RANK_CHECK(diff < tolerance, "parameters differ from one process by {}", diff);
        for (const auto& p : net->parameters())
          RANK_CHECK(testing::same_on_all_ranks(*pg, p), "parameters differ between ranks");
      },
      90s);
  expect_all_ok(results);
}

TEST(DistributedOptimizer, TwoRanksMatchOneProcess) {
  check_matches_one_process(2, 1, Compression::kNone, 1e-5);
}
TEST(DistributedOptimizer, ThreeRanksMatchOneProcess) {
  check_matches_one_process(3, 1, Compression::kNone, 1e-5);
}
TEST(DistributedOptimizer, BackwardPassesPerStepAccumulate) {
  check_matches_one_process(2, 2, Compression::kNone, 1e-5);
}
TEST(DistributedOptimizer, Fp16CompressionStaysClose) {
  check_matches_one_process(2, 1, Compression::kFp16, 5e-3);
}

TEST(DistributedOptimizer, BroadcastOptimizerStateCopiesMomentum) {
  const int port = testing::free_port();
  auto results = run_ranks(
      2,
      [&](int rank) {
        at::set_num_threads(1);
        auto pg = make_group(rank, 2, port);
        auto net = testing::make_net(true);
        torch::optim::SGD sgd(net->parameters(),
                              torch::optim::SGDOptions(0.1 + rank).momentum(0.9));
        auto local = testing::shard(testing::global_batch(rank, 8), rank, 2);
        sgd.zero_grad();
        torch::nn::functional::cross_entropy(net->forward(local.x), local.y).backward();
        sgd.step();  // different momentum buffers and learning rates per rank
        broadcast_optimizer_state(sgd, *pg, 0);
        auto& options = static_cast<torch::optim::SGDOptions&>(sgd.param_groups()[0].options());
        RANK_CHECK(std::abs(options.lr() - 0.1) < 1e-12, "lr {}", options.lr());
        for (const auto& p : net->parameters()) {
          auto& state =
              static_cast<torch::optim::SGDParamState&>(*sgd.state().at(p.unsafeGetTensorImpl()));
          RANK_CHECK(testing::same_on_all_ranks(*pg, state.momentum_buffer()), "momentum differs");
        }
      },
      60s);
  expect_all_ok(results);
}

TEST(Broadcast, CheckSameParametersPassesAfterABroadcastAndNamesARankThatDiffers) {
  const int port = testing::free_port();
  auto results = run_ranks(
      3,
      [&](int rank) {
        at::set_num_threads(1);
        auto pg = make_group(rank, 3, port);
        auto net = testing::make_net(true);
        if (rank != 0) {
          torch::NoGradGuard no_grad;
          for (auto& p : net->parameters()) p.add_(1.0);
        }
        broadcast_parameters(*net, *pg, 0);
        check_same_parameters(*net, *pg);  // equal bits: no error
        if (rank == 2) {                   // one bit of one element
          torch::NoGradGuard no_grad;
          auto p = net->parameters().front();
          auto* bits = static_cast<int32_t*>(p.data_ptr());
          bits[0] ^= 1;
        }
        std::string error;
        try {
          check_same_parameters(*net, *pg);
        } catch (const DataLossError& e) {
          error = e.what();
        }
        RANK_CHECK(error.find("the parameters and buffers of rank(s) 2 differ from rank 0's") !=
                       std::string::npos,
                   "got: {}", error);
      },
      60s);
  expect_all_ok(results);
}

// Live recovery's hand-over: ranks 0-2 hold the same state, rank 3 (a newcomer: other weights,
// no optimizer state yet) receives it in pieces from the three (the ranks on two nodes, as the
// launcher would say); with one holder of four, handed over from it. Holders whose optimizer
// states differ send the first holder's whole.
TEST(Broadcast, ANewcomerReceivesTheHoldersStateInPiecesFromEachOfThem) {
  const int port = testing::free_port();
  auto results = run_ranks(
      4,
      [&](int rank) {
        for (const auto& [name, value] :
             {std::pair{"RANK", rank}, {"WORLD_SIZE", 4}, {"LOCAL_RANK", rank % 2},
              {"LOCAL_WORLD_SIZE", 2}, {"NODE_RANK", rank / 2}})
          ::setenv(name, std::to_string(value).c_str(), 1);
        at::set_num_threads(1);
        auto pg = make_group(rank, 4, port);
        auto net = testing::make_net(true);
        const bool newcomer = rank == 3;
        torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
        if (newcomer) {
          torch::NoGradGuard no_grad;
          for (auto& p : net->parameters()) p.add_(1.0);
        } else {
          auto batch = testing::global_batch(0, 8);  // the same step on every holder
          sgd.zero_grad();
          torch::nn::functional::cross_entropy(net->forward(batch.x), batch.y).backward();
          sgd.step();
        }
        share_parameters(*net, *pg, {0, 1, 2});
        share_optimizer_state(sgd, *pg, {0, 1, 2});
        check_same_parameters(*net, *pg);
        for (const auto& p : net->parameters()) {
          auto& state =
              static_cast<torch::optim::SGDParamState&>(*sgd.state().at(p.unsafeGetTensorImpl()));
          RANK_CHECK(testing::same_on_all_ranks(*pg, state.momentum_buffer()), "momentum differs");
        }
        // Holders that disagree: rank 0's state goes whole, to every rank.
        auto& options = static_cast<torch::optim::SGDOptions&>(sgd.param_groups()[0].options());
        options.lr(rank == 2 ? 0.5 : newcomer ? 0.9 : 0.2);
        share_optimizer_state(sgd, *pg, {0, 1, 2});
        RANK_CHECK(std::abs(options.lr() - 0.2) < 1e-12, "lr {}, want rank 0's 0.2", options.lr());
        // One holder of four: a broadcast from it.
        if (rank != 1) {
          torch::NoGradGuard no_grad;
          for (auto& p : net->parameters()) p.add_(rank);
        }
        share_parameters(*net, *pg, {1});
        check_same_parameters(*net, *pg);
        // Every rank a holder: the same bytes stay as they are (nothing to send); where one
        // rank's differ, rank 0's go to every rank.
        const at::Tensor first = net->parameters()[0].detach().clone();
        share_parameters(*net, *pg, {0, 1, 2, 3});
        RANK_CHECK(torch::equal(net->parameters()[0], first), "changed though all agreed");
        if (rank == 2) {
          torch::NoGradGuard no_grad;
          for (auto& p : net->parameters()) p.add_(1.0);
        }
        share_parameters(*net, *pg, {0, 1, 2, 3});
        check_same_parameters(*net, *pg);
        RANK_CHECK(torch::equal(net->parameters()[0], first), "not rank 0's after a disagreement");
        std::string error;
        try {
          share_parameters(*net, *pg, {2, 0});
        } catch (const InvalidArgumentError& e) {
          error = e.what();
        }
        RANK_CHECK(error.find("the holders must be distinct ranks of this group of 4, in "
                              "ascending order; got [2, 0]") != std::string::npos,
                   "got: {}", error);
      },
      60s);
  expect_all_ok(results);
}

// On one node the ranks that lack the state take it straight from a holder (the k-th of them from
// the k-th holder, in turn), tensor by tensor, and the holders receive nothing; a non-contiguous
// tensor lands in place too. Holders that disagree: the first one's bytes go to every rank. Tensors
// of other sizes fail every rank, naming both.
TEST(Broadcast, OnOneNodeOnlyTheRanksLackingTheStateReceiveIt) {
  const int port = testing::free_port();
  auto results = run_ranks(
      4,
      [&](int rank) {
        at::set_num_threads(1);
        auto pg = make_group(rank, 4, port);
        const bool holder = rank == 1 || rank == 2;
        const float value = holder ? 7.0f : static_cast<float>(rank);
        std::vector<at::Tensor> tensors = {torch::full({1000, 300}, value),
                                           torch::full({64, 32}, value).t(),  // not contiguous
                                           torch::arange(5000, torch::kFloat) * (holder ? 1 : 0)};
        std::vector<int64_t> versions;
        for (const auto& t : tensors) versions.push_back(t._version());
        share_tensors(*pg, tensors, {1, 2});
        RANK_CHECK(torch::equal(tensors[0], torch::full({1000, 300}, 7.0f)) &&
                       torch::equal(tensors[1], torch::full({32, 64}, 7.0f)) &&
                       torch::equal(tensors[2], torch::arange(5000, torch::kFloat)),
                   "rank {} does not hold the holders' values", rank);
        for (size_t i = 0; i < tensors.size(); ++i)
          RANK_CHECK((tensors[i]._version() == versions[i]) == holder,
                     "rank {}: tensor {} version {} -> {} (a holder's must stay untouched, a "
                     "receiver's change)",
                     rank, i, versions[i], tensors[i]._version());
        // Holders that disagree: rank 1's bytes everywhere.
        tensors[0].fill_(rank == 2 ? 9.0f : rank == 1 ? 8.0f : 0.0f);
        share_tensors(*pg, tensors, {1, 2});
        RANK_CHECK(torch::equal(tensors[0], torch::full({1000, 300}, 8.0f)),
                   "rank {}: not rank 1's bytes after the holders disagreed", rank);
        std::vector<at::Tensor> other = {torch::zeros({rank == 3 ? 10 : 20})};
        std::string error;
        try {
          share_tensors(*pg, other, {1, 2});
        } catch (const InvalidArgumentError& e) {
          error = e.what();
        }
        RANK_CHECK(error.find("its tensors hold 80 bytes, rank 3's 40") != std::string::npos,
                   "rank {} got: {}", rank, error);
      },
      60s);
  expect_all_ok(results);
}

// The optimizer state the same way: ranks 0 and 3 (newcomers, no state yet) take it from the
// holders 1 and 2, whose own state stays as it is (not loaded again from another's bytes); when
// every rank holds the same, nothing is loaded anywhere.
TEST(Broadcast, OnOneNodeOnlyTheRanksLackingTheOptimizerStateLoadIt) {
  const int port = testing::free_port();
  auto results = run_ranks(
      4,
      [&](int rank) {
        at::set_num_threads(1);
        auto pg = make_group(rank, 4, port);
        auto net = testing::make_net(true);
        torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
        auto momentum = [&] {
          std::vector<at::Tensor> out;
          for (const auto& p : net->parameters())
            out.push_back(static_cast<torch::optim::SGDParamState&>(
                              *sgd.state().at(p.unsafeGetTensorImpl()))
                              .momentum_buffer());
          return out;
        };
        if (rank == 1 || rank == 2) {
          auto batch = testing::global_batch(0, 8);  // the same step on both holders
          sgd.zero_grad();
          torch::nn::functional::cross_entropy(net->forward(batch.x), batch.y).backward();
          sgd.step();
        }
        const auto before = rank == 1 || rank == 2 ? momentum() : std::vector<at::Tensor>{};
        share_optimizer_state(sgd, *pg, {1, 2});
        const auto after = momentum();
        for (size_t i = 0; i < after.size(); ++i) {
          RANK_CHECK(testing::same_on_all_ranks(*pg, after[i]), "momentum {} differs", i);
          if (!before.empty())
            RANK_CHECK(after[i].data_ptr() == before[i].data_ptr(),
                       "rank {}: a holder's momentum {} was loaded again", rank, i);
        }
        share_optimizer_state(sgd, *pg, {0, 1, 2, 3});
        const auto again = momentum();
        for (size_t i = 0; i < again.size(); ++i)
          RANK_CHECK(again[i].data_ptr() == after[i].data_ptr(),
                     "rank {}: momentum {} loaded though every rank held the same", rank, i);
      },
      60s);
  expect_all_ok(results);
}

}  // namespace
}  // namespace dtrain
