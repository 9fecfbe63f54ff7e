// The int8 and int4 block kernels: the rounding bound per block, tails, error feedback (the
// decoded values sum to the inputs' sum up to one rounding), zero blocks, blocks holding
// infinities or NaNs, and int4's packing;
// the bf16 and fp16 ones: rounding to nearest even, error feedback, infinities and NaNs as
// themselves, and fp16's overflow to infinity and underflow carried in the error.
#include "common/quantize.h"

#include <bit>
#include <cstdint>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/reduce.h"

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

// Int8 and int4 share their blocks' form: the tests that hold for both run for both.
struct Format {
  const char* name;
  size_t (*bytes)(size_t n);
  void (*encode)(const float* in, float* error, size_t n, std::byte* out);
  void (*decode)(const std::byte* in, size_t n, float* out, bool accumulate);
  float levels;  // the largest integer a value becomes
};
const Format kFormats[] = {{"int8", quantized_bytes, quantize_int8, dequantize_int8, 127},
                           {"int4", int4_bytes, quantize_int4, dequantize_int4, 7}};

TEST(Quantize, EachValueWithinHalfAStepOfItsBlock) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    for (size_t n : {size_t{0}, size_t{1}, size_t{255}, size_t{256}, size_t{257}, size_t{1000},
                     size_t{65536 + 7}}) {
      const auto x = random_values(n, 7);
      std::vector<std::byte> wire(f.bytes(n));
      std::vector<float> error(n, 0.0f), out(n, -1.0f);
      f.encode(x.data(), error.data(), n, wire.data());
      f.decode(wire.data(), n, out.data(), false);
      for (size_t i = 0; i < n; ++i) {
        const float step = block_largest(x, i / kQuantBlock) / f.levels;
        ASSERT_LE(std::fabs(out[i] - x[i]), step * 0.5f * (1 + 1e-5f)) << "n " << n << " i " << i;
        // The error holds what was lost (to the rounding of the decoded value: the encoder may
        // compute it with a fused multiply-add).
        ASSERT_NEAR(error[i], x[i] - out[i], std::fabs(out[i]) * 0x1p-23f)
            << "n " << n << " i " << i;
      }
    }
  }
}

TEST(Quantize, WithoutErrorFeedbackTheSameValuesAreSent) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    const auto x = random_values(1000, 3);
    std::vector<std::byte> a(f.bytes(1000)), b(f.bytes(1000));
    std::vector<float> zeros(1000, 0.0f);
    f.encode(x.data(), nullptr, 1000, a.data());
    f.encode(x.data(), zeros.data(), 1000, b.data());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0);
  }
}

TEST(Quantize, ErrorFeedbackKeepsTheSumOfWhatWasSent) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    // Sending the same values K times with feedback: the decoded values sum to K x minus the last
    // error, so their mean converges to x; without feedback the same rounding repeats every time.
    const size_t n = 512;
    const int k = 64;
    const auto x = random_values(n, 11);
    std::vector<std::byte> wire(f.bytes(n));
    std::vector<float> error(n, 0.0f), out(n), sum(n, 0.0f);
    for (int step = 0; step < k; ++step) {
      f.encode(x.data(), error.data(), n, wire.data());
      f.decode(wire.data(), n, out.data(), false);
      for (size_t i = 0; i < n; ++i) sum[i] += out[i];
    }
    f.encode(x.data(), nullptr, n, wire.data());
    f.decode(wire.data(), n, out.data(), false);
    double with = 0, without = 0;
    for (size_t i = 0; i < n; ++i) {
      with = std::max<double>(with, std::fabs(sum[i] / k - x[i]));
      without = std::max<double>(without, std::fabs(out[i] - x[i]));
      const float step = block_largest(x, i / kQuantBlock) / f.levels;
      ASSERT_LE(std::fabs(sum[i] - k * x[i]), step * (1 + 1e-3f) + std::fabs(x[i]) * k * 1e-6f)
          << i;
    }
    EXPECT_LT(with, without / 20) << "with feedback " << with << ", without " << without;
  }
}

TEST(Quantize, AccumulateAddsToTheOutput) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    const auto x = random_values(300, 5);
    std::vector<std::byte> wire(f.bytes(300));
    std::vector<float> once(300), twice(300, 0.0f);
    f.encode(x.data(), nullptr, 300, wire.data());
    f.decode(wire.data(), 300, once.data(), false);
    f.decode(wire.data(), 300, twice.data(), true);
    f.decode(wire.data(), 300, twice.data(), true);
    for (size_t i = 0; i < 300; ++i) ASSERT_EQ(twice[i], 2 * once[i]) << i;
  }
}

TEST(Quantize, ZerosAndTinyValuesAreCarriedInTheError) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    std::vector<float> x(300, 0.0f);
    x[290] = 1e-39f;  // a subnormal: no finite inverse scale
    std::vector<std::byte> wire(f.bytes(300));
    std::vector<float> error(300, 0.0f), out(300, 5.0f);
    f.encode(x.data(), error.data(), 300, wire.data());
    f.decode(wire.data(), 300, out.data(), false);
    for (size_t i = 0; i < 300; ++i) ASSERT_EQ(out[i], 0.0f) << i;
    EXPECT_EQ(error[290], 1e-39f);
  }
}

TEST(Quantize, ABlockWithInfinityOrNanArrivesAsNanAndResetsItsError) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    constexpr float kInf = std::numeric_limits<float>::infinity();
    for (float bad : {kInf, -kInf, std::numeric_limits<float>::quiet_NaN()}) {
      auto x = random_values(600, 2);
      x[300] = bad;  // the second block
      std::vector<std::byte> wire(f.bytes(600));
      std::vector<float> error(600, 0.25f), out(600);
      f.encode(x.data(), error.data(), 600, wire.data());
      f.decode(wire.data(), 600, out.data(), false);
      for (size_t i = 0; i < 600; ++i) {
        const bool second = i / kQuantBlock == 1;
        ASSERT_EQ(std::isnan(out[i]), second) << bad << " " << i;
        if (second) ASSERT_EQ(error[i], 0.0f) << i;
        else ASSERT_TRUE(std::isfinite(error[i])) << i;
      }
    }
  }
}

TEST(Quantize, ABlockCostsOneByteAValueAndAScale) {
  EXPECT_EQ(quantized_bytes(0), 0u);
  EXPECT_EQ(quantized_bytes(1), 5u);
  EXPECT_EQ(quantized_bytes(256), 260u);
  EXPECT_EQ(quantized_bytes(257), 265u);
}

TEST(Quantize, AnInt4BlockCostsHalfAByteAValueAndAScale) {
  EXPECT_EQ(int4_bytes(0), 0u);
  EXPECT_EQ(int4_bytes(1), 5u);
  EXPECT_EQ(int4_bytes(256), 132u);
  EXPECT_EQ(int4_bytes(257), 137u);
  EXPECT_EQ(int4_bytes(512), 264u);
  // Packed two to a byte, the lower half first; -7..7 each way.
  std::vector<float> x = {7.0f, -7.0f, 1.0f, -3.0f, 0.0f};
  std::vector<std::byte> wire(int4_bytes(5));
  quantize_int4(x.data(), nullptr, 5, wire.data());
  float scale;
  std::memcpy(&scale, wire.data(), sizeof scale);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(static_cast<uint8_t>(wire[4]), 0x97);  // 7, then -7 (0b1001)
  EXPECT_EQ(static_cast<uint8_t>(wire[5]), 0xd1);  // 1, then -3 (0b1101)
  EXPECT_EQ(static_cast<uint8_t>(wire[6]), 0x00);  // 0, alone
  std::vector<float> out(5);
  dequantize_int4(wire.data(), 5, out.data(), false);
  EXPECT_EQ(out, x);
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

TEST(Fp16Wire, EachValueRoundsToTheNearestFp16AndTheErrorHoldsTheRest) {
  for (size_t n : {size_t{1}, size_t{255}, size_t{256}, size_t{1000}}) {
    // Magnitudes 2^-10..2^9, inside fp16's normal range.
    const auto x = random_values(n, 11);
    std::vector<std::byte> wire(fp16_bytes(n));
    std::vector<float> error(n, 0.0f), out(n, -1.0f), added(n, 1.0f);
    encode_fp16(x.data(), error.data(), n, wire.data());
    decode_fp16(wire.data(), n, out.data(), false);
    decode_fp16(wire.data(), n, added.data(), true);
    for (size_t i = 0; i < n; ++i) {
      // The portable conversion (the reference the F16C path is tested against in reduce_test).
      ASSERT_EQ(out[i], f16_bits_to_f32(f32_to_f16_bits(x[i]))) << n << " " << i;
      ASSERT_LE(std::fabs(out[i] - x[i]), std::fabs(x[i]) * 0x1p-11f + 0x1p-25f) << n << " " << i;
      ASSERT_EQ(error[i], x[i] - out[i]) << n << " " << i;
      ASSERT_EQ(added[i], 1.0f + out[i]) << i;
    }
  }
}

TEST(Fp16Wire, TooLargeArrivesInfiniteWithNoErrorAndTooSmallIsCarried) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {1e6f, -70000.0f, std::numeric_limits<float>::quiet_NaN(), 1e-9f};
  std::vector<std::byte> wire(fp16_bytes(4));
  std::vector<float> error(4, 0.0f), out(4);
  encode_fp16(x.data(), error.data(), 4, wire.data());
  decode_fp16(wire.data(), 4, out.data(), false);
  EXPECT_EQ(out[0], inf);
  EXPECT_EQ(out[1], -inf);
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_EQ(out[3], 0.0f);  // below fp16's smallest step, 2^-24
  EXPECT_EQ(error[0], 0.0f);
  EXPECT_EQ(error[1], 0.0f);
  EXPECT_EQ(error[2], 0.0f);
  EXPECT_EQ(error[3], 1e-9f);
  // Sent again and again, the small value's error grows until a step of 2^-24 goes out: the sum
  // of what was sent keeps up with the sum of the values.
  const int k = 200;
  float tiny = 1e-9f, carried = 0.0f, sum_sent = 0.0f, one = 0.0f;
  std::vector<std::byte> w(fp16_bytes(1));
  for (int step = 0; step < k; ++step) {
    encode_fp16(&tiny, &carried, 1, w.data());
    decode_fp16(w.data(), 1, &one, false);
    sum_sent += one;
  }
  EXPECT_NEAR(sum_sent, k * 1e-9f, 0x1p-24f);
  EXPECT_GT(sum_sent, 0.0f);
}

}  // namespace
}  // namespace dtrain
