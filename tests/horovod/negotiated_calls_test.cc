// NegotiatedCalls over real processes: calls that differ fail on every rank with one text (their
// names as the callers gave them) and the group goes on; a rank that refuses its own arguments
// fails the others' call instead of leaving them waiting; a joined rank gives zeros to the others'
// all-reduces and fails their other calls.
#include "horovod/negotiated_calls.h"

#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "dtrain/error.h"
#include "support/expect.h"
#include "support/group.h"
#include "support/multiproc.h"

namespace dtrain {
namespace {

using namespace std::chrono_literals;
using testing::expect_all_ok;
using testing::make_group;
using testing::run_ranks;

Call allreduce_of(const std::vector<float>& v, ReduceOp op) {
  return Call::of(Call::Kind::kAllreduce, DType::kF32, {static_cast<int64_t>(v.size())},
                  static_cast<int64_t>(op), "");
}

// The error `call` throws, or "" when it throws none.
template <typename F>
std::string error_of(F&& call) {
  try {
    call();
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "";
}

TEST(NegotiatedCalls, CallsThatDifferFailOnEveryRankAndTheGroupGoesOn) {
  const int port = testing::free_port();
  const int n = 3;
  auto results = run_ranks(
      n,
      [&](int rank) {
        auto pg = make_group(rank, n, port);
        NegotiatedCalls calls(pg);
        bool ran = false;
        // Rank 1 passes 3 elements where the others pass 2.
        std::vector<float> v(rank == 1 ? 3 : 2, 1.0f);
        const std::string message = error_of([&] {
          calls.run(allreduce_of(v, ReduceOp::kSum),
                    [&](const NegotiatedCalls::Agreed&) { ran = true; });
        });
        RANK_CHECK(!ran, "the body ran although the calls differ");
        RANK_CHECK(message.find(fmt::format("rank {}: Horovod API call #1: the ranks' calls differ",
                                            rank)) == 0,
                   "message: {}", message);
        RANK_CHECK(message.find("ranks [0, 2] called allreduce of f32 [2] with sum; rank 1 called "
                                "allreduce of f32 [3] with sum") != std::string::npos,
                   "message: {}", message);
        // The next call, alike everywhere, runs its collective.
        std::vector<float> w(4, static_cast<float>(rank));
        calls.run(allreduce_of(w, ReduceOp::kSum), [&](const NegotiatedCalls::Agreed& agreed) {
          RANK_CHECK(agreed.calls.size() == static_cast<size_t>(n), "{} calls",
                     agreed.calls.size());
          AllreduceOptions o;
          o.op = ReduceOp::kSum;
          pg->allreduce(TensorView::of(w), o)->wait();
        });
        RANK_CHECK(w[0] == 3.0f, "sum {} != 3", w[0]);
        // Allgather: the rows may differ, the rest may not.
        const Call gather = Call::of(Call::Kind::kAllgather, DType::kF32, {rank + 1, 5}, 0, "");
        std::vector<int64_t> rows;
        calls.run(gather, [&](const NegotiatedCalls::Agreed& agreed) {
          for (const Call& c : agreed.calls) rows.push_back(c.rows());
        });
        RANK_CHECK(rows == (std::vector<int64_t>{1, 2, 3}), "rows {}", fmt::join(rows, ","));
      },
      60s);
  expect_all_ok(results);
}

// Names travel with the calls: each rank's error shows the others' names, not hashes (the first
// bytes of a long one).
TEST(NegotiatedCalls, CallsOfDifferentNamesAreToldByTheirNames) {
  const int port = testing::free_port();
  const int n = 2;
  auto results = run_ranks(
      n,
      [&](int rank) {
        auto pg = make_group(rank, n, port);
        NegotiatedCalls calls(pg);
        const std::string name =
            rank == 0 ? "grad/layer1.bias" : "model.encoder.layers.11.self_attention.weight";
        const Call call = Call::of(Call::Kind::kAllreduce, DType::kF32, {2},
                                   static_cast<int64_t>(ReduceOp::kSum), name);
        const std::string message = error_of([&] { calls.run(call, [](const auto&) {}); });
        RANK_CHECK(message.find("rank 0 called allreduce of f32 [2] with sum named "
                                "'grad/layer1.bias'; rank 1 called allreduce of f32 [2] with sum "
                                "named 'model.encoder.layers.11.self...'") != std::string::npos,
                   "message: {}", message);
      },
      60s);
  expect_all_ok(results);
}

TEST(NegotiatedCalls, ARefusedCallFailsTheOthersInsteadOfLeavingThemWaiting) {
  const int port = testing::free_port();
  auto results = run_ranks(
      2,
      [&](int rank) {
        auto pg = make_group(rank, 2, port);
        NegotiatedCalls calls(pg);
        const Call root = Call::of(Call::Kind::kBroadcast, DType::kF32, {4}, 0, "");
        if (rank == 0) {
          calls.refuse(root);  // returns: the caller throws its own error
        } else {
          const std::string message =
              error_of([&] { calls.run(root, [](const NegotiatedCalls::Agreed&) {}); });
          RANK_CHECK(message.find("rank 0 called broadcast of f32 [4] from rank 0 and refused its "
                                  "arguments") != std::string::npos,
                     "message: {}", message);
        }
      },
      60s);
  expect_all_ok(results);
}

TEST(NegotiatedCalls, AJoinedRankGivesZerosToAllreducesAndFailsTheOtherCalls) {
  const int port = testing::free_port();
  const int n = 3;
  auto results = run_ranks(
      n,
      [&](int rank) {
        auto pg = make_group(rank, n, port);
        NegotiatedCalls calls(pg);
        if (rank == 0) {
          calls.join();
          return;
        }
        std::vector<float> v(3, static_cast<float>(rank));
        calls.run(allreduce_of(v, ReduceOp::kAvg), [&](const NegotiatedCalls::Agreed&) {
          AllreduceOptions o;
          o.op = ReduceOp::kAvg;
          pg->allreduce(TensorView::of(v), o)->wait();
        });
        RANK_CHECK(v[0] == 1.0f, "average with rank 0's zeros: {} != (0 + 1 + 2) / 3", v[0]);
        const std::string message = error_of([&] {
          calls.run(Call::of(Call::Kind::kAllgather, DType::kF32, {2}, 0, ""),
                    [](const NegotiatedCalls::Agreed&) {});
        });
        RANK_CHECK(message.find("cannot run while ranks [0] have joined") != std::string::npos,
                   "message: {}", message);
        calls.join();
      },
      60s);
  expect_all_ok(results);
}

}  // namespace
}  // namespace dtrain
