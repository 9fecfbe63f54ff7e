// Reduction kernels, written once as scalar templates and vectorised by the compiler.
//
// An element encoding E (Plain<T>, Bf16, F16) says how a stored element becomes the value an op
// computes on and back: itself for f32/f64/integers, an f32 for bf16 and f16. An op (Sum, Prod,
// Min, Max, Band, Bor, Bxor) is a struct with a static apply(acc, x) that folds x into acc. visit()
// is the one place that maps (dtype, op) to (E, Op); everything else is generic.
//
// Vectorisation: the loops run over blocks of a fixed length (256, then 16, then single elements)
// because GCC's -O2 cost model vectorises only loops that need no scalar remainder, and
// `#pragma GCC ivdep` tells it that dst == a or dst == b carries no dependence between iterations
// (partial overlaps are rejected up front). Each kernel is built three times with target_clones
// (x86-64-v4 = AVX-512, x86-64-v3 = AVX2 + F16C, baseline SSE2), chosen once at load time by an
// ifunc, so the binary still runs on any x86-64. bf16 converts with 16-bit shifts, which vectorise.
// f16 uses F16C (_mm256/_mm512_cvtph_ps, cvtps_ph) in kernels of their own, picked once by
// __builtin_cpu_supports: they widen a block to f32 in L1, run the same generic op loop, and
// narrow back. CPUs without F16C use the plain bit arithmetic of reduce.h.
// Rounding f16/bf16 results from f32 once is exact: f32 has more than 2p+2 bits for p = 11 or 8,
// so double rounding cannot differ from rounding the exact sum or product.
#include "common/reduce.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include <fmt/format.h>

#include "common/vector_clones.h"
#include "dtrain/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define DTRAIN_X86 1
#endif

namespace dtrain {
namespace {

// ---- Element encodings -------------------------------------------------------------------------

template <typename T>
struct Plain {
  using Storage = T;
  static constexpr bool kFloat = std::is_floating_point_v<T>;
  static DTRAIN_INLINE T load(T x) { return x; }
  static DTRAIN_INLINE T store(T x) { return x; }
};
struct Bf16 {
  using Storage = uint16_t;
  static constexpr bool kFloat = true;
  static DTRAIN_INLINE float load(uint16_t x) { return bf16_bits_to_f32(x); }
  static DTRAIN_INLINE uint16_t store(float x) { return f32_to_bf16_bits(x); }
};
struct F16 {  // the portable path; CPUs with F16C take combine_f16 below
  using Storage = uint16_t;
  static constexpr bool kFloat = true;
  static DTRAIN_INLINE float load(uint16_t x) { return f16_bits_to_f32(x); }
  static DTRAIN_INLINE uint16_t store(float x) { return f32_to_f16_bits(x); }
};

// ---- Ops ---------------------------------------------------------------------------------------

// Integer SUM and PROD in unsigned arithmetic: wraps around without undefined behaviour.
template <typename T>
using Wide = decltype(std::make_unsigned_t<T>{} + 0u);

// Each op folds x into acc.
struct Sum {
  template <typename T>
  static DTRAIN_INLINE void apply(T& acc, const T& x) {
    if constexpr (std::is_integral_v<T>)
      acc = static_cast<T>(Wide<T>(acc) + Wide<T>(x));
    else
      acc = acc + x;
  }
};
struct Prod {
  template <typename T>
  static DTRAIN_INLINE void apply(T& acc, const T& x) {
    if constexpr (std::is_integral_v<T>)
      acc = static_cast<T>(Wide<T>(acc) * Wide<T>(x));
    else
      acc = acc * x;
  }
};
// acc != acc is true only for NaN: MIN and MAX keep a NaN, like torch.minimum / torch.maximum.
struct Min {
  template <typename T>
  static DTRAIN_INLINE void apply(T& acc, const T& x) {
    if constexpr (std::is_integral_v<T>)
      acc = acc < x ? acc : x;
    else
      acc = ((acc < x) | (acc != acc)) ? acc : x;
  }
};
struct Max {
  template <typename T>
  static DTRAIN_INLINE void apply(T& acc, const T& x) {
    if constexpr (std::is_integral_v<T>)
      acc = acc > x ? acc : x;
    else
      acc = ((acc > x) | (acc != acc)) ? acc : x;
  }
};
struct Band {
  template <typename T>
  static DTRAIN_INLINE void apply(T& acc, const T& x) {
    acc &= x;
  }
};
struct Bor {
  template <typename T>
  static DTRAIN_INLINE void apply(T& acc, const T& x) {
    acc |= x;
  }
};
struct Bxor {
  template <typename T>
  static DTRAIN_INLINE void apply(T& acc, const T& x) {
    acc ^= x;
  }
};

// ---- Generic kernels ---------------------------------------------------------------------------

// Calls body(i) for i < n in fixed-length runs the vectoriser accepts (see the top of the file).
template <typename Body>
DTRAIN_INLINE inline void for_blocks(size_t n, Body body) {
  size_t i = 0;
  for (; i + 256 <= n; i += 256) {
#pragma GCC ivdep
    for (size_t j = i; j < i + 256; ++j) body(j);
  }
  for (; i + 16 <= n; i += 16) {
#pragma GCC ivdep
    for (size_t j = i; j < i + 16; ++j) body(j);
  }
  for (; i < n; ++i) body(i);
}

template <typename E, typename Op>
DTRAIN_CLONES void combine(typename E::Storage* dst, const typename E::Storage* a,
                           const typename E::Storage* b, size_t n) {
  for_blocks(n, [=](size_t i) DTRAIN_INLINE {
    auto acc = E::load(a[i]);
    Op::apply(acc, E::load(b[i]));
    dst[i] = E::store(acc);
  });
}

// out[i] = fn(in[i]); fn is a small functor (a conversion, or a division by the rank count).
template <typename Fn, typename In, typename Out>
DTRAIN_CLONES void map_each(const In* in, Out* out, size_t n, Fn fn) {
  for_blocks(n, [=](size_t i) DTRAIN_INLINE { out[i] = fn(in[i]); });
}

struct ToBf16 {
  DTRAIN_INLINE uint16_t operator()(float x) const { return f32_to_bf16_bits(x); }
};
struct FromBf16 {
  DTRAIN_INLINE float operator()(uint16_t x) const { return bf16_bits_to_f32(x); }
};
struct ToF16 {
  DTRAIN_INLINE uint16_t operator()(float x) const { return f32_to_f16_bits(x); }
};
struct FromF16 {
  DTRAIN_INLINE float operator()(uint16_t x) const { return f16_bits_to_f32(x); }
};

template <typename T>
struct DivideBy {
  size_t divisor;
  DTRAIN_INLINE T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) {
      return x / static_cast<T>(divisor);
    } else {  // divide the magnitude, so any divisor and the most negative value both work
      uint64_t magnitude =
          x < 0 ? uint64_t{0} - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
      uint64_t quotient = magnitude / divisor;
      return static_cast<T>(x < 0 ? uint64_t{0} - quotient : quotient);
    }
  }
};

// ---- f16 with F16C -----------------------------------------------------------------------------

#ifdef DTRAIN_X86
constexpr int kNearestEven = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

enum class F16Path { kAvx512, kF16c, kPortable };
F16Path f16_path() {
#if defined(__clang__)
  // Clang 14 (the fuzzing and sanitizer builds) knows neither "x86-64-v4" nor "f16c" here: the
  // portable path serves those builds.
  static const F16Path path = F16Path::kPortable;
#else
  static const F16Path path = __builtin_cpu_supports("x86-64-v4") ? F16Path::kAvx512
                              : __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c")
                                  ? F16Path::kF16c
                                  : F16Path::kPortable;
#endif
  return path;
}

// GCC 12 warns about the deliberately undefined pass-through operand of _mm512_cvtph_ps.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("arch=x86-64-v4"))) void f16_to_f32_avx512(const uint16_t* in, float* out,
                                                                 size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i,
                     _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))));
  for (; i < n; ++i) out[i] = _cvtsh_ss(in[i]);
}

__attribute__((target("arch=x86-64-v4"))) void f32_to_f16_avx512(const float* in, uint16_t* out,
                                                                 size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(in + i), kNearestEven));
  for (; i < n; ++i) out[i] = _cvtss_sh(in[i], kNearestEven);
}
#pragma GCC diagnostic pop

__attribute__((target("avx,f16c"))) void f16_to_f32_f16c(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  for (; i < n; ++i) out[i] = _cvtsh_ss(in[i]);
}

__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), kNearestEven));
  for (; i < n; ++i) out[i] = _cvtss_sh(in[i], kNearestEven);
}

// Widen a block of a and b into two f32 arrays, fold them with the same generic loop as every
// other dtype, narrow back. The arrays stay in L1, so this costs little over a fused loop, and
// the vectoriser (rather than GCC's vector extensions, which scalarise 512-bit MIN/MAX) does the
// op.
template <typename Op>
__attribute__((target("arch=x86-64-v4"))) void combine_f16_avx512(uint16_t* dst, const uint16_t* a,
                                                                  const uint16_t* b, size_t n) {
  float x[256], y[256];
  for (size_t i = 0; i < n; i += 256) {
    size_t m = std::min<size_t>(256, n - i);
    f16_to_f32_avx512(a + i, x, m);
    f16_to_f32_avx512(b + i, y, m);
    for_blocks(m, [&](size_t j) DTRAIN_INLINE { Op::apply(x[j], y[j]); });
    f32_to_f16_avx512(x, dst + i, m);
  }
}

template <typename Op>
__attribute__((target("avx,f16c"))) void combine_f16_f16c(uint16_t* dst, const uint16_t* a,
                                                          const uint16_t* b, size_t n) {
  float x[256], y[256];
  for (size_t i = 0; i < n; i += 256) {
    size_t m = std::min<size_t>(256, n - i);
    f16_to_f32_f16c(a + i, x, m);
    f16_to_f32_f16c(b + i, y, m);
    for_blocks(m, [&](size_t j) DTRAIN_INLINE { Op::apply(x[j], y[j]); });
    f32_to_f16_f16c(x, dst + i, m);
  }
}
#endif

template <typename Op>
void combine_f16(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n) {
#ifdef DTRAIN_X86
  switch (f16_path()) {
    case F16Path::kAvx512:
      return combine_f16_avx512<Op>(dst, a, b, n);
    case F16Path::kF16c:
      return combine_f16_f16c<Op>(dst, a, b, n);
    case F16Path::kPortable:
      break;
  }
#endif
  combine<F16, Op>(dst, a, b, n);
}

// ---- Dispatch ----------------------------------------------------------------------------------

bool is_bitwise(ReduceOp op) {
  return op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
}

// The one mapping from (dtype, op) to (encoding, functor): calls fn.template operator()<E, Op>().
// The caller has run check_reduce_op, so bitwise ops never meet floating point here.
template <typename Fn>
void visit(DType dtype, ReduceOp op, Fn&& fn) {
  auto with_op = [&]<typename E>() {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return fn.template operator()<E, Sum>();
      case ReduceOp::kProd:
        return fn.template operator()<E, Prod>();
      case ReduceOp::kMin:
        return fn.template operator()<E, Min>();
      case ReduceOp::kMax:
        return fn.template operator()<E, Max>();
      case ReduceOp::kBand:
      case ReduceOp::kBor:
      case ReduceOp::kBxor:
        if constexpr (!E::kFloat) {
          if (op == ReduceOp::kBand) return fn.template operator()<E, Band>();
          if (op == ReduceOp::kBor) return fn.template operator()<E, Bor>();
          return fn.template operator()<E, Bxor>();
        }
    }
  };
  switch (dtype) {
    case DType::kF32:
      return with_op.template operator()<Plain<float>>();
    case DType::kF64:
      return with_op.template operator()<Plain<double>>();
    case DType::kF16:
      return with_op.template operator()<F16>();
    case DType::kBF16:
      return with_op.template operator()<Bf16>();
    case DType::kI8:
      return with_op.template operator()<Plain<int8_t>>();
    case DType::kU8:
      return with_op.template operator()<Plain<uint8_t>>();
    case DType::kI16:
      return with_op.template operator()<Plain<int16_t>>();
    case DType::kI32:
      return with_op.template operator()<Plain<int32_t>>();
    case DType::kI64:
      return with_op.template operator()<Plain<int64_t>>();
  }
}

// Identical or disjoint buffers are fine; a partial overlap would read already-written results.
void check_no_partial_overlap(const void* dst, const void* src, size_t nbytes, const char* what) {
  auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  if (d != s && d < s + nbytes && s < d + nbytes)
    throw InvalidArgumentError(fmt::format(
        "reduce: dst and {} overlap partially ({} bytes apart, {} bytes each); pass the same "
        "pointer or disjoint buffers",
        what, d > s ? d - s : s - d, nbytes));
}

}  // namespace

void check_reduce_op(DType dtype, ReduceOp op) {
  size_t code = static_cast<size_t>(op);
  if (code > static_cast<size_t>(ReduceOp::kBxor))
    throw InvalidArgumentError(fmt::format("unknown reduce op code {}", code));
  element_size(dtype);  // throws on an unknown dtype code
  bool is_float =
      dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kF16 || dtype == DType::kBF16;
  if (is_bitwise(op) && is_float) {
    const char* name = op == ReduceOp::kBand ? "and" : op == ReduceOp::kBor ? "or" : "xor";
    throw InvalidArgumentError(fmt::format(
        "bitwise {} ({}) needs an integer dtype, got {}: use i8, u8, i16, i32 or i64 data, or sum, "
        "prod, min, max or avg for floating point",
        name, to_string(op), to_string(dtype)));
  }
}

void reduce_to(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op) {
  check_reduce_op(dtype, op);
  if (count == 0) return;
  size_t nbytes = count * element_size(dtype);
  check_no_partial_overlap(dst, a, nbytes, "a");
  check_no_partial_overlap(dst, b, nbytes, "b");
  visit(dtype, op, [&]<typename E, typename Op>() {
    using S = typename E::Storage;
    auto* d = static_cast<S*>(dst);
    auto* x = static_cast<const S*>(a);
    auto* y = static_cast<const S*>(b);
    if constexpr (std::is_same_v<E, F16>)
      combine_f16<Op>(d, x, y, count);
    else
      combine<E, Op>(d, x, y, count);
  });
}

void reduce_into(void* dst, const void* src, size_t count, DType dtype, ReduceOp op) {
  reduce_to(dst, dst, src, count, dtype, op);
}

void scale_down(void* data, size_t count, DType dtype, size_t divisor) {
  if (divisor == 0)
    throw InvalidArgumentError(fmt::format(
        "scale_down: divisor is 0; pass the number of ranks ({} data)", to_string(dtype)));
  if (divisor == 1 || count == 0) return;
  auto divide = [&]<typename T>(T* p, size_t n) { map_each(p, p, n, DivideBy<T>{divisor}); };
  switch (dtype) {
    case DType::kF32:
      return divide(static_cast<float*>(data), count);
    case DType::kF64:
      return divide(static_cast<double*>(data), count);
    case DType::kI8:
      return divide(static_cast<int8_t*>(data), count);
    case DType::kU8:
      return divide(static_cast<uint8_t*>(data), count);
    case DType::kI16:
      return divide(static_cast<int16_t*>(data), count);
    case DType::kI32:
      return divide(static_cast<int32_t*>(data), count);
    case DType::kI64:
      return divide(static_cast<int64_t*>(data), count);
    case DType::kF16:
    case DType::kBF16: {  // once per collective: widen a chunk at a time, divide, round back
      bool half = dtype == DType::kF16;
      auto* p = static_cast<uint16_t*>(data);
      float chunk[1024];
      for (size_t i = 0; i < count; i += 1024) {
        size_t n = std::min<size_t>(1024, count - i);
        half ? f16_to_f32(p + i, chunk, n) : bf16_to_f32(p + i, chunk, n);
        divide(chunk, n);
        half ? f32_to_f16(chunk, p + i, n) : f32_to_bf16(chunk, p + i, n);
      }
      return;
    }
  }
  element_size(dtype);  // an unknown dtype code: throws
}

void f32_to_bf16(const float* in, uint16_t* out, size_t n) { map_each(in, out, n, ToBf16{}); }
void bf16_to_f32(const uint16_t* in, float* out, size_t n) { map_each(in, out, n, FromBf16{}); }

void f32_to_f16(const float* in, uint16_t* out, size_t n) {
#ifdef DTRAIN_X86
  if (f16_path() == F16Path::kAvx512) return f32_to_f16_avx512(in, out, n);
  if (f16_path() == F16Path::kF16c) return f32_to_f16_f16c(in, out, n);
#endif
  map_each(in, out, n, ToF16{});
}

void f16_to_f32(const uint16_t* in, float* out, size_t n) {
#ifdef DTRAIN_X86
  if (f16_path() == F16Path::kAvx512) return f16_to_f32_avx512(in, out, n);
  if (f16_path() == F16Path::kF16c) return f16_to_f32_f16c(in, out, n);
#endif
  map_each(in, out, n, FromF16{});
}

}  // namespace dtrain
