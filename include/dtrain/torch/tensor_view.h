// A LibTorch tensor as a TensorView, to hand it to a process group yourself:
//
//   auto loss_sum = torch::tensor({batch_loss}, torch::kDouble);
//   pg->allreduce(dtrain::view_of(loss_sum))->wait();   // loss_sum now holds every rank's sum
//
// The view aliases the tensor's storage: keep the tensor alive until the work completes.
#pragma once

#include <string>

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "dtrain/error.h"
#include "dtrain/tensor.h"

namespace dtrain {

// The dtype of a tensor's scalar type; other types throw InvalidArgumentError naming them.
inline DType to_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return DType::kF32;
    case at::kDouble:
      return DType::kF64;
    case at::kHalf:
      return DType::kF16;
    case at::kBFloat16:
      return DType::kBF16;
    case at::kChar:
      return DType::kI8;
    case at::kByte:
      return DType::kU8;
    case at::kShort:
      return DType::kI16;
    case at::kInt:
      return DType::kI32;
    case at::kLong:
      return DType::kI64;
    default:
      throw InvalidArgumentError(std::string("dtrain: tensors of dtype ") + c10::toString(type) +
                                 " cannot be communicated (supported: float, double, half, "
                                 "bfloat16, int8, uint8, int16, int32, int64)");
  }
}

// `v`, a view of `t`'s memory, with `t`'s device. For a CUDA tensor that is the GPU and the
// stream current on it now: the backends order their use of the tensor after the work queued
// on that stream so far, so it must still be current when the call is made (as torch's own
// backends expect).
inline TensorView placed_as(TensorView v, const at::Tensor& t) {
  if (t.device().type() != c10::DeviceType::CUDA) return v;
  v.device = Device::kCuda;
  v.device_index = t.device().index();
  // Through c10's device-generic interface, so that this header needs no CUDA header.
  v.stream =
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(t.device()).native_handle();
  return v;
}

// The tensor must be contiguous, on the CPU or a CUDA GPU (placed_as); anything else throws
// InvalidArgumentError saying what to call first.
inline TensorView view_of(const at::Tensor& t) {
  const auto type = t.device().type();
  if (!t.is_contiguous() || (type != c10::DeviceType::CPU && type != c10::DeviceType::CUDA))
    throw InvalidArgumentError("dtrain: expected a contiguous CPU or CUDA tensor, got one on " +
                               t.device().str() +
                               " (contiguous: " + (t.is_contiguous() ? "true" : "false") +
                               "); call .contiguous() or .cpu() first");
  return placed_as(
      TensorView{t.data_ptr(), static_cast<size_t>(t.numel()), to_dtype(t.scalar_type())}, t);
}

}  // namespace dtrain
