// A non-owning view of a typed buffer: what every dtrain operation sends, receives or reduces.
// The caller keeps the memory alive until the operation's Work completes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace dtrain {

// Appended only: the codes travel in messages and files.
enum class DType : uint8_t { kF32, kF64, kF16, kBF16, kI8, kU8, kI32, kI64, kI16 };
enum class Device : uint8_t { kCpu, kCuda };

size_t element_size(DType dtype);
std::string_view to_string(DType dtype);
// Parses "f32", "float32", "float", ... ; throws InvalidArgumentError on an unknown name.
DType parse_dtype(std::string_view name);

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kF32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::kF64;
}
template <>
constexpr DType dtype_of<int8_t>() {
  return DType::kI8;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::kU8;
}
template <>
constexpr DType dtype_of<int16_t>() {
  return DType::kI16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::kI64;
}

struct TensorView {
  void* data = nullptr;
  size_t numel = 0;
  DType dtype = DType::kU8;
  Device device = Device::kCpu;
  int device_index = 0;
  // For a CUDA tensor, the stream (a cudaStream_t) its producer queued the work that writes it
  // on: the backends order their use of the tensor after it. Null: the legacy default stream.
  void* stream = nullptr;

  size_t nbytes() const { return numel * element_size(dtype); }
  std::span<std::byte> bytes() const { return {static_cast<std::byte*>(data), nbytes()}; }

  template <typename T>
  static TensorView of(std::span<T> s) {
    using U = std::remove_const_t<T>;
    return TensorView{const_cast<U*>(s.data()), s.size(), dtype_of<U>()};
  }
  template <typename T>
  static TensorView of(std::vector<T>& v) {
    return of(std::span<T>(v));
  }
  static TensorView raw(void* data, size_t nbytes) { return TensorView{data, nbytes, DType::kU8}; }
};

}  // namespace dtrain
