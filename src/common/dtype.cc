#include <string>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/tensor.h"

namespace dtrain {

size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI8:
      return 1;
    case DType::kU8:
      return 1;
    case DType::kI16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
  }
  throw InvalidArgumentError(fmt::format("unknown dtype code {}", static_cast<int>(dtype)));
}

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI8:
      return "i8";
    case DType::kU8:
      return "u8";
    case DType::kI16:
      return "i16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"f32", DType::kF32},   {"float32", DType::kF32},   {"float", DType::kF32},
      {"f64", DType::kF64},   {"float64", DType::kF64},   {"double", DType::kF64},
      {"f16", DType::kF16},   {"float16", DType::kF16},   {"half", DType::kF16},
      {"bf16", DType::kBF16}, {"bfloat16", DType::kBF16}, {"i8", DType::kI8},
      {"int8", DType::kI8},   {"u8", DType::kU8},         {"uint8", DType::kU8},
      {"i16", DType::kI16},   {"int16", DType::kI16},     {"short", DType::kI16},
      {"i32", DType::kI32},   {"int32", DType::kI32},     {"int", DType::kI32},
      {"i64", DType::kI64},   {"int64", DType::kI64},     {"long", DType::kI64},
  };
  for (const auto& a : kAliases)
    if (a.name == name) return a.dtype;
  throw InvalidArgumentError(fmt::format(
      "unknown dtype '{}': use one of f32, f64, f16, bf16, i8, u8, i16, i32, i64", name));
}

}  // namespace dtrain
