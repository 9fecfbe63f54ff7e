// The DistributedOptimizer's coordinator over real processes: tensors submitted in different
// orders still reduce together (fused, then from the cache), and a tensor missing on one rank
// fails everywhere with an error naming it and the ranks.
#include "torch/coordinator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>

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

}  // namespace
}  // namespace dtrain
