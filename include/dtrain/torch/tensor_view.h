// TensorView of a LibTorch tensor: how dtrain_torch hands tensors to the process group.
#pragma once

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/tensor.h"

namespace dtrain::torch_detail {

inline DType to_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return DType::kF32;
    case at::kDouble: return DType::kF64;
    case at::kHalf: return DType::kF16;
    case at::kBFloat16: return DType::kBF16;
    case at::kChar: return DType::kI8;
    case at::kByte: return DType::kU8;
    case at::kInt: return DType::kI32;
    case at::kLong: return DType::kI64;
    default:
      throw InvalidArgumentError(fmt::format(
          "dtrain: tensors of dtype {} cannot be communicated (supported: float, double, half, "
          "bfloat16, int8, uint8, int32, int64)",
          c10::toString(type)));
  }
}

// The tensor must be a contiguous CPU tensor; the view aliases its storage.
inline TensorView view_of(const at::Tensor& t) {
  if (!t.is_contiguous() || t.device().type() != c10::DeviceType::CPU)
    throw InvalidArgumentError(fmt::format(
        "dtrain: expected a contiguous CPU tensor, got one on {} (contiguous: {}); call "
        ".contiguous() or .cpu() first",
        t.device().str(), t.is_contiguous()));
  return TensorView{t.data_ptr(), static_cast<size_t>(t.numel()), to_dtype(t.scalar_type())};
}

}  // namespace dtrain::torch_detail
