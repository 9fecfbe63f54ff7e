// The reduction kernels against a scalar reference: every dtype x op, counts around the vector
// widths, aliasing, f16/bf16 rounding, integer wrap-around, AVG scaling and rejected ops.
#include "common/reduce.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dtrain/error.h"

namespace dtrain {
namespace {

constexpr DType kDTypes[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI8,
                             DType::kU8,  DType::kI16, DType::kI32, DType::kI64};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                             ReduceOp::kAvg, ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor};
constexpr size_t kCounts[] = {0, 1, 7, 8, 15, 16, 17, 1000, (1u << 20) + 3};

bool is_float(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kF16 || t == DType::kBF16;
}
bool is_bitwise(ReduceOp op) {
  return op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
}

// ---- An independent oracle for rounding to a narrow float format --------------------------------

// Rounds x to the nearest value with `bits` significant bits, exponent >= min_exp (subnormals) and
// magnitude below `overflow` (else infinity), ties to even: done in double with frexp and
// nearbyint, not with the bit tricks under test.
double round_narrow(double x, int bits, int min_exp, double overflow) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  int e;
  std::frexp(x, &e);  // |x| = m * 2^e, m in [0.5, 1)
  int quantum = std::max(e - bits, min_exp);
  double r = std::nearbyint(std::ldexp(x, -quantum));  // default rounding mode: to nearest even
  double y = std::ldexp(r, quantum);
  return std::fabs(y) >= overflow ? std::copysign(INFINITY, x) : y;
}
double round_f16(double x) { return round_narrow(x, 11, -24, 65536.0); }
double round_bf16(double x) { return round_narrow(x, 8, -133, 0x1p128); }

uint16_t ref_f32_to_f16(float f) {
  if (std::isnan(f)) return std::signbit(f) ? 0xfe00 : 0x7e00;
  // The rounding is done; r is an f16 value, so the compiler's _Float16 holds it exactly.
  return std::bit_cast<uint16_t>(static_cast<_Float16>(round_f16(f)));
}

uint16_t ref_f32_to_bf16(float f) {
  double r = round_bf16(f);
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(r)) >>
                               16);  // r is exact in f32
}

// ---- Typed buffers and the scalar reference ----------------------------------------------------

struct Buffer {
  DType dtype;
  std::vector<std::byte> bytes;
  Buffer(DType t, size_t n) : dtype(t), bytes(n * element_size(t)) {}
  size_t size() const { return bytes.size() / element_size(dtype); }
  void* data() { return bytes.data(); }
  // The element as a double (exact for every dtype except i64 beyond 2^53, compared as bits).
  double get(size_t i) const {
    auto at = [&]<typename T>() {
      T v;
      std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
      return v;
    };
    switch (dtype) {
      case DType::kF32:
        return at.operator()<float>();
      case DType::kF64:
        return at.operator()<double>();
      case DType::kF16:
        return f16_bits_to_f32(at.operator()<uint16_t>());
      case DType::kBF16:
        return bf16_bits_to_f32(at.operator()<uint16_t>());
      case DType::kI8:
        return at.operator()<int8_t>();
      case DType::kU8:
        return at.operator()<uint8_t>();
      case DType::kI16:
        return at.operator()<int16_t>();
      case DType::kI32:
        return at.operator()<int32_t>();
      case DType::kI64:
        return static_cast<double>(at.operator()<int64_t>());
    }
    return 0;
  }
};

// Random data; floats include zeros of both signs, infinities, NaN and subnormals now and then.
Buffer random_buffer(DType dtype, size_t n, uint64_t seed) {
  Buffer b(dtype, n);
  std::mt19937_64 rng(seed);
  if (!is_float(dtype)) {
    for (auto& byte : b.bytes) byte = static_cast<std::byte>(rng());
    return b;
  }
  std::uniform_real_distribution<double> value(-4.0, 4.0);
  for (size_t i = 0; i < n; ++i) {
    double v = value(rng);
    switch (rng() % 64) {
      case 0:
        v = 0.0;
        break;
      case 1:
        v = -0.0;
        break;
      case 2:
        v = INFINITY;
        break;
      case 3:
        v = -INFINITY;
        break;
      case 4:
        v = NAN;
        break;
      case 5:
        v = dtype == DType::kF16                            ? 3 * 0x1p-24
            : dtype == DType::kBF16 || dtype == DType::kF32 ? 0x1p-130
                                                            : 0x1p-1070;
        break;
      default:
        break;
    }
    std::byte* p = b.bytes.data() + i * element_size(dtype);
    switch (dtype) {
      case DType::kF32: {
        float f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::kF64:
        std::memcpy(p, &v, 8);
        break;
      case DType::kF16: {
        uint16_t h = ref_f32_to_f16(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kBF16: {
        uint16_t h = ref_f32_to_bf16(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        break;
      }
      default:
        break;
    }
  }
  return b;
}

template <typename T>
T ref_int(T a, T b, ReduceOp op) {
  uint64_t x = static_cast<uint64_t>(a), y = static_cast<uint64_t>(b);  // wraps: computed mod 2^64
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return static_cast<T>(x + y);
    case ReduceOp::kProd:
      return static_cast<T>(x * y);
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
    case ReduceOp::kBand:
      return static_cast<T>(x & y);
    case ReduceOp::kBor:
      return static_cast<T>(x | y);
    case ReduceOp::kBxor:
      return static_cast<T>(x ^ y);
  }
  return 0;
}

// Floats: the exact result in double, rounded once to the dtype (which is what rounding the f32
// result of f16/bf16 inputs gives too). MIN and MAX propagate NaN.
double ref_float(double a, double b, ReduceOp op, DType dtype) {
  double r;
  switch (op) {
    case ReduceOp::kProd:
      r = a * b;
      break;
    case ReduceOp::kMin:
      r = std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
      break;
    case ReduceOp::kMax:
      r = std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
      break;
    default:
      r = a + b;
      break;
  }
  switch (dtype) {
    case DType::kF32:
      return static_cast<float>(r);
    case DType::kF16:
      return round_f16(r);
    case DType::kBF16:
      return round_bf16(r);
    default:
      return r;
  }
}

Buffer reference(const Buffer& a, const Buffer& b, ReduceOp op) {
  Buffer out(a.dtype, a.size());
  auto ints = [&]<typename T>() {
    const T* x = reinterpret_cast<const T*>(a.bytes.data());
    const T* y = reinterpret_cast<const T*>(b.bytes.data());
    T* o = reinterpret_cast<T*>(out.bytes.data());
    for (size_t i = 0; i < a.size(); ++i) o[i] = ref_int(x[i], y[i], op);
  };
  switch (a.dtype) {
    case DType::kI8:
      ints.operator()<int8_t>();
      return out;
    case DType::kU8:
      ints.operator()<uint8_t>();
      return out;
    case DType::kI16:
      ints.operator()<int16_t>();
      return out;
    case DType::kI32:
      ints.operator()<int32_t>();
      return out;
    case DType::kI64:
      ints.operator()<int64_t>();
      return out;
    default:
      break;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    double r = ref_float(a.get(i), b.get(i), op, a.dtype);
    std::byte* p = out.bytes.data() + i * element_size(a.dtype);
    switch (a.dtype) {
      case DType::kF32: {
        float f = static_cast<float>(r);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::kF64:
        std::memcpy(p, &r, 8);
        break;
      case DType::kF16: {
        uint16_t h = ref_f32_to_f16(static_cast<float>(r));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kBF16: {
        uint16_t h = ref_f32_to_bf16(static_cast<float>(r));
        std::memcpy(p, &h, 2);
        break;
      }
      default:
        break;
    }
  }
  return out;
}

// Integers bit for bit; floats by value (so -0 == +0 in MIN/MAX), NaN equal to NaN.
::testing::AssertionResult same(const Buffer& want, const Buffer& got) {
  for (size_t i = 0; i < want.size(); ++i) {
    size_t w = element_size(want.dtype);
    bool equal;
    if (is_float(want.dtype)) {
      double x = want.get(i), y = got.get(i);
      equal = x == y || (std::isnan(x) && std::isnan(y));
    } else {
      equal = std::memcmp(want.bytes.data() + i * w, got.bytes.data() + i * w, w) == 0;
    }
    if (!equal)
      return ::testing::AssertionFailure() << "element " << i << " of " << want.size() << ": want "
                                           << want.get(i) << ", got " << got.get(i);
  }
  return ::testing::AssertionSuccess();
}

TEST(Reduce, EveryDtypeAndOpMatchesTheReference) {
  uint64_t seed = 1;
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      if (is_bitwise(op) && is_float(dtype)) continue;
      for (size_t count : kCounts) {
        SCOPED_TRACE(fmt::format("{} {} count {}", to_string(dtype), to_string(op), count));
        Buffer a = random_buffer(dtype, count, seed++), b = random_buffer(dtype, count, seed++);
        Buffer want = reference(a, b, op);

        Buffer into = a;
        reduce_into(into.data(), b.data(), count, dtype, op);
        EXPECT_TRUE(same(want, into));

        Buffer to(dtype, count);
        reduce_to(to.data(), a.data(), b.data(), count, dtype, op);
        EXPECT_TRUE(same(want, to));

        Buffer alias_a = a;  // dst == a
        reduce_to(alias_a.data(), alias_a.data(), b.data(), count, dtype, op);
        EXPECT_TRUE(same(want, alias_a));

        Buffer alias_b = b;  // dst == b: still a (op) b, in that order
        reduce_to(alias_b.data(), a.data(), alias_b.data(), count, dtype, op);
        EXPECT_TRUE(same(want, alias_b));
      }
    }
  }
}

TEST(Reduce, OffsetsWithinABufferAreNotAligned) {
  // Ring algorithms reduce chunks at arbitrary element offsets: no alignment may be assumed.
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8, DType::kI64}) {
    Buffer a = random_buffer(dtype, 600, 7), b = random_buffer(dtype, 600, 8);
    for (size_t offset : {1, 3, 5}) {
      size_t w = element_size(dtype), n = 600 - offset;
      Buffer got = a;
      reduce_into(got.bytes.data() + offset * w, b.bytes.data() + offset * w, n, dtype,
                  ReduceOp::kSum);
      Buffer want = reference(a, b, ReduceOp::kSum);
      std::memcpy(want.bytes.data(), a.bytes.data(), offset * w);
      EXPECT_TRUE(same(want, got)) << to_string(dtype) << " offset " << offset;
    }
  }
}

TEST(Reduce, SelfReductionAndPartialOverlap) {
  std::vector<int32_t> v = {1, -2, 3, 1 << 30};
  reduce_into(v.data(), v.data(), v.size(), DType::kI32, ReduceOp::kSum);
  EXPECT_EQ(v, (std::vector<int32_t>{2, -4, 6, std::numeric_limits<int32_t>::min()}));

  std::vector<float> f(32, 1.0f);
  try {
    reduce_into(f.data() + 1, f.data(), 16, DType::kF32, ReduceOp::kSum);
    FAIL() << "a partial overlap was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("overlap"), std::string::npos) << e.what();
  }
  EXPECT_THROW(reduce_to(f.data(), f.data() + 16, f.data() + 8, 16, DType::kF32, ReduceOp::kSum),
               InvalidArgumentError);
  reduce_to(f.data(), f.data() + 16, f.data() + 16, 16, DType::kF32,
            ReduceOp::kSum);  // a == b is fine
  EXPECT_EQ(f[0], 2.0f);
}

TEST(Reduce, IntegerSumAndProdWrapAround) {
  auto one = [](auto a, auto b, DType dtype, ReduceOp op) {
    reduce_into(&a, &b, 1, dtype, op);
    return a;
  };
  EXPECT_EQ(one(int8_t{127}, int8_t{1}, DType::kI8, ReduceOp::kSum), int8_t{-128});
  EXPECT_EQ(one(int8_t{-128}, int8_t{-1}, DType::kI8, ReduceOp::kProd), int8_t{-128});
  EXPECT_EQ(one(int8_t{16}, int8_t{16}, DType::kI8, ReduceOp::kProd), int8_t{0});
  EXPECT_EQ(one(uint8_t{255}, uint8_t{1}, DType::kU8, ReduceOp::kSum), uint8_t{0});
  EXPECT_EQ(one(int16_t{32767}, int16_t{1}, DType::kI16, ReduceOp::kSum), int16_t{-32768});
  EXPECT_EQ(one(int16_t{-300}, int16_t{200}, DType::kI16, ReduceOp::kProd), int16_t{5536});
  EXPECT_EQ(one(uint8_t{16}, uint8_t{17}, DType::kU8, ReduceOp::kProd), uint8_t{16});
  EXPECT_EQ(one(std::numeric_limits<int32_t>::max(), 1, DType::kI32, ReduceOp::kSum),
            std::numeric_limits<int32_t>::min());
  EXPECT_EQ(one(std::numeric_limits<int32_t>::min(), -1, DType::kI32, ReduceOp::kProd),
            std::numeric_limits<int32_t>::min());
  EXPECT_EQ(one(std::numeric_limits<int64_t>::max(), int64_t{1}, DType::kI64, ReduceOp::kSum),
            std::numeric_limits<int64_t>::min());
  EXPECT_EQ(one(int64_t{1} << 32, int64_t{1} << 32, DType::kI64, ReduceOp::kProd), int64_t{0});
  // The same through the vector loops.
  std::vector<int32_t> big(1000, std::numeric_limits<int32_t>::max()), ones(1000, 1);
  reduce_into(big.data(), ones.data(), big.size(), DType::kI32, ReduceOp::kAvg);
  for (int32_t x : big) ASSERT_EQ(x, std::numeric_limits<int32_t>::min());
}

TEST(Reduce, MinMaxKeepNaN) {
  std::vector<float> a = {NAN, 1.0f, NAN, -INFINITY}, b = {2.0f, NAN, NAN, 3.0f};
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    std::vector<float> d(4);
    reduce_to(d.data(), a.data(), b.data(), 4, DType::kF32, op);
    EXPECT_TRUE(std::isnan(d[0]) && std::isnan(d[1]) && std::isnan(d[2])) << to_string(op);
    EXPECT_EQ(d[3], op == ReduceOp::kMin ? -INFINITY : 3.0f);
  }
}

// ---- Conversions
// ---------------------------------------------------------------------------------

// f32 values that probe rounding: every representable value, the midpoints between neighbours
// (ties), one f32 ulp either side of them, and random bit patterns (NaN payloads included).
std::vector<float> rounding_probes(float (*widen)(uint16_t)) {
  std::vector<float> probes;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float x = widen(static_cast<uint16_t>(h));
    float next = widen(static_cast<uint16_t>(h + 1));
    probes.push_back(x);
    if ((h & 0x7fff) < 0x7bff || (widen == bf16_bits_to_f32 && (h & 0x7fff) < 0x7f7f)) {
      float mid = static_cast<float>((static_cast<double>(x) + next) / 2);
      probes.insert(probes.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY),
                                   std::nextafter(mid, -INFINITY)});
    }
  }
  std::mt19937 rng(42);
  for (int i = 0; i < 200000; ++i)
    probes.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  for (uint32_t bits : {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7f801fffu, 0x477fefffu,
                        0x477ff000u, 0x477fffffu, 0x7f7fffffu, 0x7f7f8000u, 0x00000001u,
                        0x33000000u, 0x33000001u, 0x33c00000u, 0x387fc000u, 0x387fe000u})
    probes.push_back(std::bit_cast<float>(bits));
  return probes;
}

void expect_same_bits_or_nan(uint16_t want, uint16_t got, uint16_t nan_mask, float from) {
  bool want_nan = (want & 0x7fff) > nan_mask, got_nan = (got & 0x7fff) > nan_mask;
  if (want_nan || got_nan) {
    EXPECT_TRUE(want_nan && got_nan)
        << std::hex << "from f32 bits " << std::bit_cast<uint32_t>(from) << ": want " << want
        << ", got " << got;
  } else {
    EXPECT_EQ(want, got) << std::hex << "from f32 bits " << std::bit_cast<uint32_t>(from);
  }
}

TEST(Conversions, F16RoundsToNearestEven) {
  std::vector<float> probes = rounding_probes(f16_bits_to_f32);
  std::vector<uint16_t> bulk(probes.size());
  f32_to_f16(probes.data(), bulk.data(), probes.size());
  for (size_t i = 0; i < probes.size(); ++i) {
    float f = probes[i];
    uint16_t want = std::isnan(f) ? 0x7e00 : static_cast<uint16_t>(0);
    if (!std::isnan(f)) {
      double r = round_f16(f);
      want = std::bit_cast<uint16_t>(static_cast<_Float16>(r));          // exact: r is an f16 value
      ASSERT_EQ(static_cast<double>(static_cast<_Float16>(f)), r) << f;  // the compiler agrees
    }
    expect_same_bits_or_nan(want, f32_to_f16_bits(f), 0x7c00, f);
    expect_same_bits_or_nan(want, bulk[i], 0x7c00, f);
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_EQ(f32_to_f16_bits(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16_bits(65519.99f), 0x7bff);
  EXPECT_EQ(f32_to_f16_bits(65520.0f), 0x7c00);  // the tie rounds to even: infinity
  EXPECT_EQ(f32_to_f16_bits(-1e9f), 0xfc00);
  EXPECT_EQ(f32_to_f16_bits(0x1p-25f), 0x0000);    // half the smallest subnormal: to even 0
  EXPECT_EQ(f32_to_f16_bits(0x1.8p-24f), 0x0002);  // 1.5 quanta: to even 2
  EXPECT_EQ(f32_to_f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16_bits(1.0f + 0x1p-11f), 0x3c00);    // tie between 1 and 1+2^-10: to even 1
  EXPECT_EQ(f32_to_f16_bits(1.0f + 0x1.8p-10f), 0x3c02);  // tie between 1+2^-10 and 1+2^-9: to even
}

TEST(Conversions, F16ToF32IsExactForAllValues) {
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> bulk(all.size());
  f16_to_f32(all.data(), bulk.data(), all.size());
  std::vector<uint16_t> back(all.size());
  f32_to_f16(bulk.data(), back.data(), bulk.size());
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float want = static_cast<float>(std::bit_cast<_Float16>(all[h]));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(bulk[h]) && std::isnan(f16_bits_to_f32(all[h]))) << std::hex << h;
      ASSERT_EQ(back[h] & 0x7e00, 0x7e00) << std::hex << h;  // NaN stays NaN (made quiet)
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(want), std::bit_cast<uint32_t>(bulk[h])) << std::hex << h;
      ASSERT_EQ(std::bit_cast<uint32_t>(want), std::bit_cast<uint32_t>(f16_bits_to_f32(all[h])))
          << std::hex << h;
      ASSERT_EQ(back[h], all[h]) << std::hex << h;  // round trip
    }
  }
}

TEST(Conversions, Bf16RoundsToNearestEven) {
  std::vector<float> probes = rounding_probes(bf16_bits_to_f32);
  std::vector<uint16_t> bulk(probes.size());
  f32_to_bf16(probes.data(), bulk.data(), probes.size());
  for (size_t i = 0; i < probes.size(); ++i) {
    float f = probes[i];
    uint16_t want = std::isnan(f) ? 0x7fc0 : ref_f32_to_bf16(f);
    expect_same_bits_or_nan(want, f32_to_bf16_bits(f), 0x7f80, f);
    expect_same_bits_or_nan(want, bulk[i], 0x7f80, f);
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_EQ(f32_to_bf16_bits(std::bit_cast<float>(0x7f800001u)), 0x7fc0);  // not infinity
  EXPECT_EQ(f32_to_bf16_bits(std::bit_cast<float>(0x7f7fffffu)), 0x7f80);  // max f32 overflows
  EXPECT_EQ(f32_to_bf16_bits(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie to even (down)
  EXPECT_EQ(f32_to_bf16_bits(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie to even (up)
  EXPECT_EQ(f32_to_bf16_bits(std::bit_cast<float>(0x00008000u)), 0x0000);  // subnormal tie to 0
  EXPECT_EQ(f32_to_bf16_bits(std::bit_cast<float>(0x00018000u)), 0x0002);  // subnormal tie up
}

TEST(Conversions, Bf16ToF32IsExactAndTailsMatch) {
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> bulk(all.size());
  bf16_to_f32(all.data(), bulk.data(), all.size());
  for (uint32_t h = 0; h < 0x10000; ++h) ASSERT_EQ(std::bit_cast<uint32_t>(bulk[h]), h << 16);
  // Every length up to a few vectors: the bulk paths (vector body + tail) equal the scalar one.
  std::vector<float> f(80);
  std::mt19937 rng(3);
  for (float& x : f) x = std::uniform_real_distribution<float>(-1e5f, 1e5f)(rng);
  for (size_t n = 0; n <= f.size(); ++n) {
    std::vector<uint16_t> h16(n + 1, 0xabcd), b16(n + 1, 0xabcd);
    f32_to_f16(f.data(), h16.data(), n);
    f32_to_bf16(f.data(), b16.data(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(h16[i], f32_to_f16_bits(f[i])) << n;
      ASSERT_EQ(b16[i], f32_to_bf16_bits(f[i])) << n;
    }
    ASSERT_EQ(h16[n], 0xabcd) << "wrote past the end, n = " << n;
    ASSERT_EQ(b16[n], 0xabcd) << "wrote past the end, n = " << n;
  }
}

TEST(Reduce, HalfPrecisionSumRoundsOnce) {
  // 2048 + 1 is a tie in f16 (quantum 2 there): rounds to even 2048; 2050 + 1 rounds up to 2052.
  std::vector<uint16_t> a = {f32_to_f16_bits(2048), f32_to_f16_bits(2050), f32_to_f16_bits(65504),
                             0x7c00, 0x0001};
  std::vector<uint16_t> b = {f32_to_f16_bits(1), f32_to_f16_bits(1), f32_to_f16_bits(16), 0xfc00,
                             0x0001};
  reduce_into(a.data(), b.data(), a.size(), DType::kF16, ReduceOp::kSum);
  EXPECT_EQ(f16_bits_to_f32(a[0]), 2048.0f);
  EXPECT_EQ(f16_bits_to_f32(a[1]), 2052.0f);
  EXPECT_EQ(a[2], 0x7c00);                         // 65520: overflows to infinity
  EXPECT_TRUE(std::isnan(f16_bits_to_f32(a[3])));  // inf + -inf
  EXPECT_EQ(a[4], 0x0002);                         // subnormals add exactly
  // bf16: 256 + 1 is a tie (quantum 2): to even 256.
  std::vector<uint16_t> c = {f32_to_bf16_bits(256), f32_to_bf16_bits(258)},
                        d = {f32_to_bf16_bits(1), f32_to_bf16_bits(1)};
  reduce_into(c.data(), d.data(), c.size(), DType::kBF16, ReduceOp::kSum);
  EXPECT_EQ(bf16_bits_to_f32(c[0]), 256.0f);
  EXPECT_EQ(bf16_bits_to_f32(c[1]), 260.0f);
}

// ---- AVG ----------------------------------------------------------------------------------------

TEST(ScaleDown, FloatsDivide) {
  for (size_t n : {size_t{1}, size_t{17}, size_t{1000}, size_t{3000}}) {
    std::vector<float> f(n);
    std::vector<double> d(n);
    std::vector<uint16_t> h(n), bf(n);
    for (size_t i = 0; i < n; ++i) {
      f[i] = static_cast<float>(i) - 7.5f;
      d[i] = f[i];
      h[i] = f32_to_f16_bits(f[i]);
      bf[i] = f32_to_bf16_bits(f[i]);
    }
    std::vector<uint16_t> h0 = h, bf0 = bf;
    scale_down(f.data(), n, DType::kF32, 3);
    scale_down(d.data(), n, DType::kF64, 3);
    scale_down(h.data(), n, DType::kF16, 3);
    scale_down(bf.data(), n, DType::kBF16, 3);
    for (size_t i = 0; i < n; ++i) {
      float x = static_cast<float>(i) - 7.5f;
      ASSERT_EQ(f[i], x / 3.0f);
      ASSERT_EQ(d[i], static_cast<double>(x) / 3.0);
      ASSERT_EQ(h[i], ref_f32_to_f16(f16_bits_to_f32(h0[i]) / 3.0f)) << i;
      ASSERT_EQ(bf[i], ref_f32_to_bf16(bf16_bits_to_f32(bf0[i]) / 3.0f)) << i;
    }
  }
}

TEST(ScaleDown, IntegersTruncateTowardZero) {
  std::vector<int32_t> v = {7,
                            -7,
                            8,
                            -8,
                            0,
                            1,
                            -1,
                            std::numeric_limits<int32_t>::min(),
                            std::numeric_limits<int32_t>::max()};
  scale_down(v.data(), v.size(), DType::kI32, 2);
  EXPECT_EQ(v, (std::vector<int32_t>{3, -3, 4, -4, 0, 0, 0, -(1 << 30), (1 << 30) - 1}));
  std::vector<int8_t> i8 = {-128, 127, -5, 5};
  scale_down(i8.data(), i8.size(), DType::kI8, 3);
  EXPECT_EQ(i8, (std::vector<int8_t>{-42, 42, -1, 1}));
  std::vector<int8_t> i8_big = {-128, 127};
  scale_down(i8_big.data(), i8_big.size(), DType::kI8, 1000);  // wider than the type: no overflow
  EXPECT_EQ(i8_big, (std::vector<int8_t>{0, 0}));
  std::vector<uint8_t> u8 = {255, 7};
  scale_down(u8.data(), u8.size(), DType::kU8, 2);
  EXPECT_EQ(u8, (std::vector<uint8_t>{127, 3}));
  std::vector<int64_t> i64 = {std::numeric_limits<int64_t>::min(), -9, 9};
  scale_down(i64.data(), i64.size(), DType::kI64, 4);
  EXPECT_EQ(i64, (std::vector<int64_t>{std::numeric_limits<int64_t>::min() / 4, -2, 2}));
  std::vector<int64_t> huge = {std::numeric_limits<int64_t>::min()};
  scale_down(huge.data(), 1, DType::kI64, size_t{1} << 63);
  EXPECT_EQ(huge[0], -1);
  // Through the vector loops, and AVG end to end: sum of 3 ranks, then divide by 3.
  std::vector<int32_t> acc(1003, -10), r1(1003, 4), r2(1003, 1);
  reduce_into(acc.data(), r1.data(), acc.size(), DType::kI32, ReduceOp::kAvg);
  reduce_into(acc.data(), r2.data(), acc.size(), DType::kI32, ReduceOp::kAvg);
  scale_down(acc.data(), acc.size(), DType::kI32, 3);
  for (int32_t x : acc) ASSERT_EQ(x, -1);  // -5 / 3 truncates to -1
}

TEST(ScaleDown, RejectsZeroAndIgnoresOne) {
  std::vector<float> f = {3.0f};
  EXPECT_THROW(scale_down(f.data(), 1, DType::kF32, 0), InvalidArgumentError);
  scale_down(f.data(), 1, DType::kF32, 1);
  EXPECT_EQ(f[0], 3.0f);
  scale_down(nullptr, 0, DType::kF32, 2);
}

// ---- Validation and names ----------------------------------------------------------------------

TEST(CheckReduceOp, BitwiseOnFloatsIsRejectedWithAClearMessage) {
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      if (!(is_bitwise(op) && is_float(dtype))) {
        EXPECT_NO_THROW(check_reduce_op(dtype, op));
        continue;
      }
      try {
        check_reduce_op(dtype, op);
        ADD_FAILURE() << to_string(op) << " accepted on " << to_string(dtype);
      } catch (const InvalidArgumentError& e) {
        std::string m = e.what();
        EXPECT_NE(m.find(std::string(to_string(op))), std::string::npos) << m;
        EXPECT_NE(m.find(std::string(to_string(dtype))), std::string::npos) << m;
        EXPECT_NE(m.find("integer dtype"), std::string::npos) << m;
      }
    }
  }
  float x = 1, y = 2;
  try {
    reduce_into(&x, &y, 1, DType::kF32, ReduceOp::kBand);
    FAIL() << "band on f32 was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("bitwise and (band) needs an integer dtype, got f32"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(reduce_into(&x, &y, 0, DType::kF16, ReduceOp::kBxor),
               InvalidArgumentError);  // even when empty
  EXPECT_THROW(check_reduce_op(DType::kF32, static_cast<ReduceOp>(42)), InvalidArgumentError);
}

TEST(ReduceOpNames, RoundTripAndRejectUnknown) {
  for (ReduceOp op : kOps) EXPECT_EQ(parse_reduce_op(to_string(op)), op);
  try {
    parse_reduce_op("mean");
    FAIL() << "'mean' was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("'mean'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("avg"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dtrain
