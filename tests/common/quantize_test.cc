// The int8 block kernels: the rounding bound per block, tails, error feedback (the decoded values
// sum to the inputs' sum up to one rounding), zero blocks, and blocks holding infinities or NaNs;
// the bf16 ones: rounding to nearest even, error feedback, infinities and NaNs as themselves.
#include "common/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace dtrain {
namespace {

std::vector<float> random_values(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  // Blocks of very different magnitudes, as a bucket of gradients has.
  for (size_t i = 0; i < n; ++i) v[i] = normal(gen) * std::ldexp(1.0f, static_cast<int>(i / 256 % 20) - 10);
  return v;
}

float block_largest(const std::vector<float>& v, size_t block) {
  float m = 0;
  for (size_t i = block * kQuantBlock; i < std::min(v.size(), (block + 1) * kQuantBlock); ++i)
    m = std::max(m, std::fabs(v[i]));
  return m;
}

TEST(Quantize, EachValueWithinHalfAStepOfItsBlock) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{255}, size_t{256}, size_t{257}, size_t{1000},
                   size_t{65536 + 7}}) {
    const auto x = random_values(n, 7);
    std::vector<std::byte> wire(quantized_bytes(n));
    std::vector<float> error(n, 0.0f), out(n, -1.0f);
    quantize_int8(x.data(), error.data(), n, wire.data());
    dequantize_int8(wire.data(), n, out.data(), false);
    for (size_t i = 0; i < n; ++i) {
      const float step = block_largest(x, i / kQuantBlock) / 127;
      ASSERT_LE(std::fabs(out[i] - x[i]), step * 0.5f * (1 + 1e-5f)) << "n " << n << " i " << i;
      // The error holds what was lost (to the rounding of the decoded value: the encoder may
      // compute it with a fused multiply-add).
      ASSERT_NEAR(error[i], x[i] - out[i], std::fabs(out[i]) * 0x1p-23f) << "n " << n << " i " << i;
    }
  }
}

TEST(Quantize, WithoutErrorFeedbackTheSameValuesAreSent) {
  const auto x = random_values(1000, 3);
  std::vector<std::byte> a(quantized_bytes(1000)), b(quantized_bytes(1000));
  std::vector<float> zeros(1000, 0.0f);
  quantize_int8(x.data(), nullptr, 1000, a.data());
  quantize_int8(x.data(), zeros.data(), 1000, b.data());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0);
}

TEST(Quantize, ErrorFeedbackKeepsTheSumOfWhatWasSent) {
  // Sending the same values K times with feedback: the decoded values sum to K x minus the last
  // error, so their mean converges to x; without feedback the same rounding repeats every time.
  const size_t n = 512;
  const int k = 64;
  const auto x = random_values(n, 11);
  std::vector<std::byte> wire(quantized_bytes(n));
  std::vector<float> error(n, 0.0f), out(n), sum(n, 0.0f);
  for (int step = 0; step < k; ++step) {
    quantize_int8(x.data(), error.data(), n, wire.data());
    dequantize_int8(wire.data(), n, out.data(), false);
    for (size_t i = 0; i < n; ++i) sum[i] += out[i];
  }
  quantize_int8(x.data(), nullptr, n, wire.data());
  dequantize_int8(wire.data(), n, out.data(), false);
  double with = 0, without = 0;
  for (size_t i = 0; i < n; ++i) {
    with = std::max<double>(with, std::fabs(sum[i] / k - x[i]));
    without = std::max<double>(without, std::fabs(out[i] - x[i]));
    const float step = block_largest(x, i / kQuantBlock) / 127;
    ASSERT_LE(std::fabs(sum[i] - k * x[i]), step * (1 + 1e-3f) + std::fabs(x[i]) * k * 1e-6f)
        << i;
  }
  EXPECT_LT(with, without / 20) << "with feedback " << with << ", without " << without;
}

TEST(Quantize, AccumulateAddsToTheOutput) {
  const auto x = random_values(300, 5);
  std::vector<std::byte> wire(quantized_bytes(300));
  std::vector<float> once(300), twice(300, 0.0f);
  quantize_int8(x.data(), nullptr, 300, wire.data());
  dequantize_int8(wire.data(), 300, once.data(), false);
  dequantize_int8(wire.data(), 300, twice.data(), true);
  dequantize_int8(wire.data(), 300, twice.data(), true);
  for (size_t i = 0; i < 300; ++i) ASSERT_EQ(twice[i], 2 * once[i]) << i;
}

TEST(Quantize, ZerosAndTinyValuesAreCarriedInTheError) {
  std::vector<float> x(300, 0.0f);
  x[290] = 1e-39f;  // a subnormal: no finite inverse scale
  std::vector<std::byte> wire(quantized_bytes(300));
  std::vector<float> error(300, 0.0f), out(300, 5.0f);
  quantize_int8(x.data(), error.data(), 300, wire.data());
  dequantize_int8(wire.data(), 300, out.data(), false);
  for (size_t i = 0; i < 300; ++i) ASSERT_EQ(out[i], 0.0f) << i;
  EXPECT_EQ(error[290], 1e-39f);
}

TEST(Quantize, ABlockWithInfinityOrNanArrivesAsNanAndResetsItsError) {
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    auto x = random_values(600, 2);
    x[300] = bad;  // the second block
    std::vector<std::byte> wire(quantized_bytes(600));
    std::vector<float> error(600, 0.25f), out(600);
    quantize_int8(x.data(), error.data(), 600, wire.data());
    dequantize_int8(wire.data(), 600, out.data(), false);
    for (size_t i = 0; i < 600; ++i) {
      const bool second = i / kQuantBlock == 1;
      ASSERT_EQ(std::isnan(out[i]), second) << bad << " " << i;
      if (second) ASSERT_EQ(error[i], 0.0f) << i;
      else ASSERT_TRUE(std::isfinite(error[i])) << i;
    }
  }
}

TEST(Quantize, ABlockCostsOneByteAValueAndAScale) {
  EXPECT_EQ(quantized_bytes(0), 0u);
  EXPECT_EQ(quantized_bytes(1), 5u);
  EXPECT_EQ(quantized_bytes(256), 260u);
  EXPECT_EQ(quantized_bytes(257), 265u);
}

TEST(Bf16Wire, EachValueRoundsToTheNearestBf16AndTheErrorHoldsTheRest) {
  for (size_t n : {size_t{1}, size_t{255}, size_t{256}, size_t{1000}}) {
    const auto x = random_values(n, 9);
    std::vector<std::byte> wire(bf16_bytes(n));
    std::vector<float> error(n, 0.0f), out(n, -1.0f), added(n, 1.0f);
    encode_bf16(x.data(), error.data(), n, wire.data());
    decode_bf16(wire.data(), n, out.data(), false);
    decode_bf16(wire.data(), n, added.data(), true);
    for (size_t i = 0; i < n; ++i) {
      // 8 significant bits: within half a unit of the last, at most 2^-8 of the value.
      ASSERT_LE(std::fabs(out[i] - x[i]), std::fabs(x[i]) * 0x1p-8f) << n << " " << i;
      ASSERT_EQ(error[i], x[i] - out[i]) << n << " " << i;  // exact: out has 8 bits of x's 24
      ASSERT_EQ(added[i], 1.0f + out[i]) << i;
    }
  }
  // Ties go to even: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7.
  const float tie = 1.0f + 0x1p-8f;
  std::vector<std::byte> one(bf16_bytes(1));
  float back = 0;
  encode_bf16(&tie, nullptr, 1, one.data());
  decode_bf16(one.data(), 1, &back, false);
  EXPECT_EQ(back, 1.0f);
}

TEST(Bf16Wire, ErrorFeedbackKeepsTheSumOfWhatWasSent) {
  const size_t n = 300;
  const int k = 64;
  const auto x = random_values(n, 4);
  std::vector<std::byte> wire(bf16_bytes(n));
  std::vector<float> error(n, 0.0f), out(n);
  std::vector<double> sum(n, 0.0);
  for (int step = 0; step < k; ++step) {
    encode_bf16(x.data(), error.data(), n, wire.data());
    decode_bf16(wire.data(), n, out.data(), false);
    for (size_t i = 0; i < n; ++i) sum[i] += out[i];
  }
  for (size_t i = 0; i < n; ++i)
    ASSERT_LE(std::fabs(sum[i] - k * static_cast<double>(x[i])), std::fabs(x[i]) * 0x1p-8) << i;
}

TEST(Bf16Wire, InfinitiesAndNansArriveAsThemselvesWithNoError) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {inf, -inf, std::numeric_limits<float>::quiet_NaN(), 2.5f};
  std::vector<std::byte> wire(bf16_bytes(4));
  std::vector<float> error(4, 0.0f), out(4);
  encode_bf16(x.data(), error.data(), 4, wire.data());
  decode_bf16(wire.data(), 4, out.data(), false);
  EXPECT_EQ(out[0], inf);
  EXPECT_EQ(out[1], -inf);
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_EQ(out[3], 2.5f);
  for (float e : error) EXPECT_EQ(e, 0.0f);
}

}  // namespace
}  // namespace dtrain
