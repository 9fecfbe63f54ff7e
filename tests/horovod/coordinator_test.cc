// The DistributedOptimizer's coordinator over real processes: tensors submitted in different
// orders still reduce together (fused, then from the cache), each with its own op; a tensor
// missing on one rank fails everywhere with an error naming it and the ranks; one submitted with
// different sizes fails alone on every rank and the coordinator goes on; ranks that join early
// contribute zeros until the last one joins.
#include "horovod/coordinator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "common/env.h"
#include "dtrain/error.h"
#include "support/group.h"
#include "support/expect.h"
#include "support/multiproc.h"

namespace dtrain {
namespace {

using namespace std::chrono_literals;
using testing::make_group;
using testing::expect_all_ok;
using testing::run_ranks;

TEST(Coordinator, DifferentSubmissionOrdersReduceTheSameTensors) {
  const int port = testing::free_port();
  const int n = 3;
  auto results = run_ranks(n, [&](int rank) {
    auto pg = make_group(rank, n, port);
    CoordinatorOptions o;
    o.fusion_threshold_bytes = 64;  // 16 floats: forces several fused buffers
    Coordinator coordinator(pg, o);
    std::vector<std::string> names = {"a", "b", "c", "d", "e"};
    std::vector<size_t> sizes = {3, 10, 1, 20, 7};
    for (int step = 0; step < 4; ++step) {
      std::vector<std::vector<float>> data(names.size());
      for (size_t t = 0; t < names.size(); ++t)
        data[t].assign(sizes[t], static_cast<float>(rank * 10 + t + step));
      // Rank r submits in a rotated order, some with a delay, so arrival differs per rank.
      std::vector<std::shared_ptr<Coordinator::Handle>> handles(names.size());
      for (size_t k = 0; k < names.size(); ++k) {
        size_t t = (k + static_cast<size_t>(rank) * 2) % names.size();
        if (rank == 1 && k == 2) std::this_thread::sleep_for(5ms);
        handles[t] = coordinator.submit(names[t], TensorView::of(data[t]));
      }
      for (size_t t = 0; t < names.size(); ++t) {
        handles[t]->wait(20s);
        float mean_rank = (n - 1) / 2.0f;
        float want = mean_rank * 10 + t + step;
        for (float v : data[t]) RANK_CHECK(std::abs(v - want) < 1e-5f, "tensor {} step {}: {} != {}", names[t], step, v, want);
      }
    }
    auto stats = coordinator.stats();
    RANK_CHECK(stats.tensors == 20, "reduced {} tensors, expected 20", stats.tensors);
    RANK_CHECK(stats.cached_tensors >= 10, "only {} tensors ran from the cache", stats.cached_tensors);
  }, 60s);
  expect_all_ok(results);
}

TEST(Coordinator, TensorMissingOnOneRankGivesANamedError) {
  const int port = testing::free_port();
  auto results = run_ranks(2, [&](int rank) {
    auto pg = make_group(rank, 2, port);
    CoordinatorOptions o;
    o.stall_timeout = 500ms;
    Coordinator coordinator(pg, o);
    std::vector<float> shared(4, 1.0f), only_rank0(4, 2.0f);
    auto h = coordinator.submit("layer.weight", TensorView::of(shared));
    std::shared_ptr<Coordinator::Handle> missing;
    if (rank == 0) missing = coordinator.submit("layer.extra", TensorView::of(only_rank0));
    h->wait(10s);
    std::string message;
    if (rank == 0) {
      try {
        missing->wait(10s);
      } catch (const TimeoutError& e) {
        message = e.what();
      }
    } else {
      auto deadline = std::chrono::steady_clock::now() + 10s;
      while (!coordinator.error() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(10ms);
      try {
        if (auto e = coordinator.error()) std::rethrow_exception(e);
      } catch (const TimeoutError& e) {
        message = e.what();
      }
    }
    RANK_CHECK(message.find("'layer.extra'") != std::string::npos, "message: {}", message);
    RANK_CHECK(message.find("ready on ranks [0]") != std::string::npos, "message: {}", message);
    RANK_CHECK(message.find("missing on ranks [1]") != std::string::npos, "message: {}", message);
    RANK_CHECK(message.find(fmt::format("rank {}", rank)) == 0, "message: {}", message);
  }, 60s);
  expect_all_ok(results);
}

TEST(Coordinator, ATensorSubmittedDifferentlyFailsOnEveryRankAndTheOthersGoOn) {
  const int port = testing::free_port();
  auto results = run_ranks(2, [&](int rank) {
    auto pg = make_group(rank, 2, port);
    Coordinator coordinator(pg, CoordinatorOptions{});
    std::vector<float> good(4, 1.0f + rank), bad(rank == 0 ? 3 : 5, 1.0f);
    auto h_good = coordinator.submit("good", TensorView::of(good), ReduceOp::kSum);
    auto h_bad = coordinator.submit("bad", TensorView::of(bad), ReduceOp::kSum);
    std::string message;
    try {
      h_bad->wait(10s);
    } catch (const InvalidArgumentError& e) {
      message = e.what();
    }
    RANK_CHECK(message.find(fmt::format("rank {}: ", rank)) == 0, "message: {}", message);
    RANK_CHECK(message.find("tensor 'bad' differs between ranks") != std::string::npos,
               "message: {}", message);
    RANK_CHECK(message.find("the others go on") != std::string::npos, "message: {}", message);
    h_good->wait(10s);
    RANK_CHECK(good[0] == 3.0f, "good: {}", good[0]);
    RANK_CHECK(coordinator.error() == nullptr, "the coordinator stopped");
    // The same name again, now alike: it runs.
    std::vector<float> again(2, 1.0f);
    coordinator.submit("bad", TensorView::of(again), ReduceOp::kSum)->wait(10s);
    RANK_CHECK(again[0] == 2.0f, "again: {}", again[0]);
  }, 60s);
  expect_all_ok(results);
}

TEST(Coordinator, EachTensorIsReducedWithItsOwnOp) {
  const int port = testing::free_port();
  const int n = 3;
  auto results = run_ranks(n, [&](int rank) {
    auto pg = make_group(rank, n, port);
    Coordinator coordinator(pg, CoordinatorOptions{});
    const std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg,
                                       ReduceOp::kMin, ReduceOp::kSum};
    for (int step = 0; step < 3; ++step) {  // the first negotiates, the others run cached
      std::vector<std::vector<double>> data(ops.size());
      std::vector<std::shared_ptr<Coordinator::Handle>> handles;
      for (size_t t = 0; t < ops.size(); ++t) {
        data[t].assign(5, rank + 1.0 + static_cast<double>(t));
        handles.push_back(coordinator.submit(fmt::format("t{}", t), TensorView::of(data[t]), ops[t]));
      }
      for (size_t t = 0; t < ops.size(); ++t) {
        handles[t]->wait(20s);
        const double lo = 1.0 + t, hi = n + static_cast<double>(t);
        double want = 0;
        switch (ops[t]) {
          case ReduceOp::kSum: want = (lo + hi) * n / 2; break;
          case ReduceOp::kAvg: want = (lo + hi) / 2; break;
          case ReduceOp::kMax: want = hi; break;
          default: want = lo; break;
        }
        for (double v : data[t]) RANK_CHECK(v == want, "t{} step {}: {} != {}", t, step, v, want);
      }
    }
  }, 60s);
  expect_all_ok(results);
}

TEST(Coordinator, JoinedRanksContributeZerosUntilTheLastJoins) {
  const int port = testing::free_port();
  const int n = 3;
  auto results = run_ranks(n, [&](int rank) {
    auto pg = make_group(rank, n, port);
    Coordinator coordinator(pg, CoordinatorOptions{});
    // Rank r has r + 1 batches: rank 0 joins after one step, rank 1 after two, rank 2 after three.
    for (int step = 0; step <= rank; ++step) {
      std::vector<float> grad(4, static_cast<float>(rank + 1));
      std::vector<float> sum(2, static_cast<float>(rank + 1));
      auto a = coordinator.submit("grad", TensorView::of(grad), ReduceOp::kAvg);
      auto s = coordinator.submit(fmt::format("sum{}", step), TensorView::of(sum), ReduceOp::kSum);
      a->wait(20s);
      s->wait(20s);
      // Ranks step..n-1 still have data at this step: their values are step+1..n.
      float contributing = static_cast<float>(n - step);
      float total = 0;
      for (int r = step; r < n; ++r) total += static_cast<float>(r + 1);
      for (float v : grad) RANK_CHECK(v == total / contributing, "step {}: average {} != {}", step, v, total / contributing);
      for (float v : sum) RANK_CHECK(v == total, "step {}: sum {} != {}", step, v, total);
    }
    auto join = coordinator.join();
    RANK_CHECK(join->wait_for(30s), "join did not finish");
    RANK_CHECK(join->last_joined() == n - 1, "last joined {} != {}", join->last_joined(), n - 1);
    // After everyone joined, the coordinator runs as before.
    std::vector<float> after(3, static_cast<float>(rank));
    coordinator.submit("after", TensorView::of(after), ReduceOp::kSum)->wait(20s);
    for (float v : after) RANK_CHECK(v == 3.0f, "after join: {} != 3", v);
  }, 60s);
  expect_all_ok(results);
}

// The Python sessions take the coordinator's settings from DTRAIN_CYCLE_TIME_MS,
// DTRAIN_FUSION_THRESHOLD and DTRAIN_STALL_TIMEOUT, so unset they must mean the coordinator's own
// defaults.
TEST(Coordinator, DefaultsAreThoseOfTheEnvironmentTable) {
  const CoordinatorOptions o{};
  using Milliseconds = std::chrono::duration<double, std::milli>;
  EXPECT_DOUBLE_EQ(Milliseconds(o.cycle_time).count(),
                   std::stod(std::string(env::kCycleTimeMs.default_value)));
  EXPECT_EQ(o.fusion_threshold_bytes,
            static_cast<size_t>(std::stoull(std::string(env::kFusionThreshold.default_value))));
  EXPECT_DOUBLE_EQ(std::chrono::duration<double>(o.stall_timeout).count(),
                   std::stod(std::string(env::kStallTimeout.default_value)));
}

}  // namespace
}  // namespace dtrain
