// The int8, bf16 and fp16 all-reduces (AllreduceOptions::wire) in real processes, on shared
// memory and over TCP: every rank ends with the same bits, within the rounding bound of the exact
// sum; error feedback makes repeated calls average to the exact result; awkward counts; the
// checks at the call; the wires' names; and a rank that calls another wire than the others is
// named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/quantize.h"
#include "dtrain/error.h"
#include "support/expect.h"
#include "support/group.h"
#include "support/multiproc.h"

namespace dtrain::testing {
namespace {

// Rank r's values: a different draw per rank, with blocks of very different magnitudes.
std::vector<float> values_of(int rank, size_t n) {
  std::mt19937 gen(1000 + static_cast<unsigned>(rank));
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = normal(gen) * std::ldexp(1.0f, static_cast<int>(i / kQuantBlock % 12) - 6);
  return v;
}

std::vector<double> exact_sum(int world, size_t n) {
  std::vector<double> s(n, 0.0);
  for (int r = 0; r < world; ++r) {
    const auto v = values_of(r, n);
    for (size_t i = 0; i < n; ++i) s[i] += v[i];
  }
  return s;
}

// The rounding bound of one call, per block: each rank's copy of the block rounded once (its own
// not at all, but any rank may own it) and the result once, each within half a step of its block.
// `levels`: the largest integer a value becomes (127 for int8, 7 for int4).
std::vector<double> bounds(int world, size_t n, const std::vector<double>& sum, double levels) {
  const size_t blocks = (n + kQuantBlock - 1) / kQuantBlock;
  std::vector<double> step_in(blocks, 0.0), largest_sum(blocks, 0.0);
  for (int r = 0; r < world; ++r) {
    const auto v = values_of(r, n);
    std::vector<double> m(blocks, 0.0);
    for (size_t j = 0; j < n; ++j)
      m[j / kQuantBlock] = std::max<double>(m[j / kQuantBlock], std::fabs(v[j]));
    for (size_t b = 0; b < blocks; ++b) step_in[b] += m[b] / levels;
  }
  for (size_t j = 0; j < n; ++j)
    largest_sum[j / kQuantBlock] = std::max(largest_sum[j / kQuantBlock], std::fabs(sum[j]));
  std::vector<double> out(blocks);
  // The result's block grows by the inputs' rounding before it is rounded itself.
  for (size_t b = 0; b < blocks; ++b)
    out[b] = 0.5 * step_in[b] + 0.5 * (largest_sum[b] + 0.5 * step_in[b]) / levels + 1e-6;
  return out;
}

// Every rank's result, gathered exactly, is the same bits as rank 0's.
void expect_same_everywhere(ProcessGroup& pg, const std::vector<float>& x) {
  std::vector<float> all(x.size() * static_cast<size_t>(pg.size()));
  pg.allgather(TensorView::of(all), TensorView::of(const_cast<std::vector<float>&>(x)))->wait();
  for (int r = 1; r < pg.size(); ++r)
    RANK_CHECK(std::memcmp(all.data(), all.data() + x.size() * r, x.size() * sizeof(float)) == 0,
               "rank {}'s result differs from rank 0's", r);
}

// The 16-bit bound of one call, per element: each rank's copy rounded once, the result once, each
// within u of its value (the unit roundoff: 2^-8 for bf16, 2^-11 for fp16) or, below fp16's
// normal range, within half its smallest step (2^-25), and the f32 additions.
double half_bound(Wire wire, int world, size_t i, const std::vector<std::vector<float>>& inputs,
                  double sum) {
  const double u = wire == Wire::kBf16 ? 0x1p-8 : 0x1p-11;
  const double tiny = wire == Wire::kBf16 ? 0 : 0x1p-25;
  double in = 0;
  for (int r = 0; r < world; ++r) in += std::fabs(inputs[r][i]);
  return in * u + (std::fabs(sum) + in * u) * u + (world + 1) * tiny + in * 1e-6 + 1e-12;
}

void check_one_call(int world, const std::string& transport, Wire wire = Wire::kInt8) {
  const int port = free_port();
  expect_all_ok(run_ranks(world, [&](int rank) {
    auto pg = make_group(rank, world, port, {.transport = transport});
    for (size_t n : {size_t{1}, size_t{5}, size_t{255}, size_t{1000}, size_t{100003}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        auto x = values_of(rank, n);
        pg->allreduce(TensorView::of(x), {.op = op, .wire = wire})->wait();
        expect_same_everywhere(*pg, x);
        const auto want = exact_sum(world, n);
        const bool blocks = wire == Wire::kInt8 || wire == Wire::kInt4;
        const auto bound = bounds(world, n, want, wire == Wire::kInt4 ? 7 : 127);
        std::vector<std::vector<float>> inputs;
        for (int r = 0; r < world; ++r) inputs.push_back(values_of(r, n));
        const double divide = op == ReduceOp::kAvg ? world : 1;
        for (size_t i = 0; i < n; ++i) {
          const double error = std::fabs(x[i] - want[i] / divide);
          const double limit = blocks ? bound[i / kQuantBlock]
                                      : half_bound(wire, world, i, inputs, want[i]);
          RANK_CHECK(error <= limit / divide, "n {} {} element {}: {} vs exact {}", n,
                     to_string(op), i, x[i], want[i] / divide);
        }
      }
    }
  }));
}

TEST(QuantizedAllreduce, TwoRanksOnSharedMemory) { check_one_call(2, "auto"); }
TEST(QuantizedAllreduce, ThreeRanksOverTcp) { check_one_call(3, "tcp"); }
TEST(QuantizedAllreduce, FourRanksOnSharedMemory) { check_one_call(4, "auto"); }
TEST(QuantizedAllreduce, Bf16OnThreeRanksOverTcp) { check_one_call(3, "tcp", Wire::kBf16); }
TEST(QuantizedAllreduce, Bf16OnFourRanksOnSharedMemory) { check_one_call(4, "auto", Wire::kBf16); }
TEST(QuantizedAllreduce, Fp16OnThreeRanksOverTcp) { check_one_call(3, "tcp", Wire::kFp16); }
TEST(QuantizedAllreduce, Fp16OnTwoRanksOnSharedMemory) { check_one_call(2, "auto", Wire::kFp16); }
TEST(QuantizedAllreduce, Int4OnThreeRanksOverTcp) { check_one_call(3, "tcp", Wire::kInt4); }
TEST(QuantizedAllreduce, Int4OnFourRanksOnSharedMemory) { check_one_call(4, "auto", Wire::kInt4); }

void check_error_feedback(Wire wire) {
  // The same inputs K times: with feedback the mean of the results converges to the exact sum
  // (what each call's rounding lost goes into the next); without it every call rounds alike.
  const int world = 3, k = 40;
  const size_t n = 3000;
  const int port = free_port();
  expect_all_ok(run_ranks(world, [&](int rank) {
    auto pg = make_group(rank, world, port);
    const auto want = exact_sum(world, n);
    std::vector<float> error(n, 0.0f), mean(n, 0.0f);
    for (int step = 0; step < k; ++step) {
      auto x = values_of(rank, n);
      pg->allreduce(TensorView::of(x), {.wire = wire, .error = TensorView::of(error)})->wait();
      for (size_t i = 0; i < n; ++i) mean[i] += x[i] / k;
    }
    auto once = values_of(rank, n);
    pg->allreduce(TensorView::of(once), {.wire = wire})->wait();
    double with = 0, without = 0;
    for (size_t i = 0; i < n; ++i) {
      with = std::max(with, std::fabs(mean[i] - want[i]));
      without = std::max(without, std::fabs(once[i] - want[i]));
    }
    RANK_CHECK(with < without / 8, "with feedback {} vs without {}", with, without);
  }));
}

TEST(QuantizedAllreduce, ErrorFeedbackAveragesToTheExactSum) { check_error_feedback(Wire::kInt8); }
TEST(QuantizedAllreduce, Bf16ErrorFeedbackAveragesToTheExactSum) {
  check_error_feedback(Wire::kBf16);
}
TEST(QuantizedAllreduce, Fp16ErrorFeedbackAveragesToTheExactSum) {
  check_error_feedback(Wire::kFp16);
}
TEST(QuantizedAllreduce, Int4ErrorFeedbackAveragesToTheExactSum) {
  check_error_feedback(Wire::kInt4);
}

TEST(QuantizedAllreduce, WiresAreNamed) {
  for (Wire w : {Wire::kExact, Wire::kInt8, Wire::kBf16, Wire::kFp16, Wire::kInt4})
    EXPECT_EQ(parse_wire(to_string(w)), w);
  try {
    parse_wire("int2");
    ADD_FAILURE() << "parse_wire accepted int2";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("'int2': choose exact, int8, int4, bf16 or fp16"),
              std::string::npos)
        << e.what();
  }
}

TEST(QuantizedAllreduce, ChecksAtTheCall) {
  const int port = free_port();
  expect_all_ok(run_ranks(1, [&](int rank) {
    auto pg = make_group(rank, 1, port);
    std::vector<float> v(8), short_error(7);
    std::vector<double> d(8);
    auto expect_invalid = [&](auto fn, const char* needle) {
      try {
        fn();
        RANK_CHECK(false, "accepted: {}", needle);
      } catch (const InvalidArgumentError& e) {
        RANK_CHECK(std::string(e.what()).find(needle) != std::string::npos, "{}", e.what());
      }
    };
    expect_invalid([&] { pg->allreduce(TensorView::of(d), {.wire = Wire::kInt8}); },
                   "f32 values and SUM or AVG, not f64");
    expect_invalid([&] { pg->allreduce(TensorView::of(d), {.wire = Wire::kBf16}); },
                   "bf16 on the wire takes f32 values");
    expect_invalid([&] { pg->allreduce(TensorView::of(d), {.wire = Wire::kFp16}); },
                   "fp16 on the wire takes f32 values");
    expect_invalid([&] { pg->allreduce(TensorView::of(d), {.wire = Wire::kInt4}); },
                   "int4 on the wire takes f32 values");
    expect_invalid(
        [&] { pg->allreduce(TensorView::of(v), {.op = ReduceOp::kMax, .wire = Wire::kInt8}); },
        "not f32 and max");
    expect_invalid(
        [&] {
          pg->allreduce(TensorView::of(v),
                        {.wire = Wire::kInt8, .error = TensorView::of(short_error)});
        },
        "error-feedback buffer is f32 of 7 elements but the tensor has 8");
    expect_invalid([&] { pg->allreduce(TensorView::of(v), {.error = TensorView::of(v)}); },
                   "the wire is exact");
    // One rank: nothing to round; the values stay as they are.
    std::vector<float> x = {1.5f, -2.25f, 3e-3f};
    pg->allreduce(TensorView::of(x), {.wire = Wire::kInt8})->wait();
    RANK_CHECK(x[0] == 1.5f && x[1] == -2.25f && x[2] == 3e-3f, "{} {} {}", x[0], x[1], x[2]);
  }));
}

// Rank 0 calls with `first`, rank 1 with `second`: both fail, naming rank 0's call.
void check_mismatch_named(Wire first, Wire second, const std::string& named) {
  const int port = free_port();
  auto results = run_ranks(2, [&](int rank) {
    auto pg = make_group(rank, 2, port, {}, std::chrono::seconds(10));
    std::vector<float> x(4096, 1.0f);
    try {
      pg->allreduce(TensorView::of(x), {.wire = rank == 0 ? first : second})->wait();
    } catch (const Error& e) {
      const std::string what = e.what();
      RANK_CHECK(what.find(named) != std::string::npos, "{}", what);
      ::_exit(3);
    }
    ::_exit(0);
  });
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_EQ(results[r].exit_code, 3) << "rank " << r << " did not fail as expected";
}

TEST(QuantizedAllreduce, ARankCallingTheExactFormIsNamed) {
  check_mismatch_named(Wire::kInt8, Wire::kExact, "all_reduce_int8(f32, 4096, sum)");
}
TEST(QuantizedAllreduce, ARankCallingAnother16BitWireIsNamed) {
  check_mismatch_named(Wire::kFp16, Wire::kBf16, "all_reduce_fp16(f32, 4096, sum)");
}

}  // namespace
}  // namespace dtrain::testing
