// Buffer-protocol arrays as TensorViews (see array.h).
#include "python/core/array.h"

#include <fmt/format.h>

#include "dtrain/error.h"

namespace py = pybind11;

namespace dtrain::python {

namespace {

DType dtype_of(const py::buffer_info& info, const char* what) {
  std::string f = info.format;
  if (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@' || f[0] == '|')) f.erase(0, 1);
  const auto size = info.itemsize;
  if (f == "f" && size == 4) return DType::kF32;
  if (f == "d" && size == 8) return DType::kF64;
  if (f == "e" && size == 2) return DType::kF16;
  if (f == "b" && size == 1) return DType::kI8;
  if ((f == "B" || f == "?") && size == 1) return DType::kU8;
  if (f == "h" && size == 2) return DType::kI16;
  if ((f == "i" || f == "l") && size == 4) return DType::kI32;
  if ((f == "l" || f == "q") && size == 8) return DType::kI64;
  throw InvalidArgumentError(fmt::format(
      "{}: arrays of format '{}' ({} bytes per element) cannot be communicated; use float32, "
      "float64, float16, int8, uint8, int16, int32 or int64",
      what, info.format, size));
}

}  // namespace

TensorView view_of_array(const py::buffer& array, bool writable, const char* what) {
  py::buffer_info info;
  try {
    info = array.request(writable);
  } catch (const py::error_already_set& e) {
    throw InvalidArgumentError(fmt::format("{}: {}{}", what, e.what(),
                                           writable ? " (the result is written into it)" : ""));
  }
  const DType dtype = dtype_of(info, what);
  py::ssize_t expected = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] != 1 && info.strides[d] != expected)
      throw InvalidArgumentError(
          fmt::format("{}: the array is not C-contiguous; pass numpy.ascontiguousarray(a)", what));
    expected *= info.shape[d];
  }
  return TensorView{info.ptr, static_cast<size_t>(info.size), dtype};
}

std::chrono::milliseconds timeout_of(double seconds, const char* what) {
  if (!(seconds >= 0 && seconds <= 365.0 * 24 * 3600))
    throw InvalidArgumentError(
        fmt::format("{}: timeout {} s is out of range; give a finite number of seconds, at least 0",
                    what, seconds));
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

py::array new_array(DType dtype, size_t numel) {
  const char* name = nullptr;
  switch (dtype) {
    case DType::kF32:
      name = "float32";
      break;
    case DType::kF64:
      name = "float64";
      break;
    case DType::kF16:
      name = "float16";
      break;
    case DType::kI8:
      name = "int8";
      break;
    case DType::kU8:
      name = "uint8";
      break;
    case DType::kI16:
      name = "int16";
      break;
    case DType::kI32:
      name = "int32";
      break;
    case DType::kI64:
      name = "int64";
      break;
    default:
      throw InvalidArgumentError(fmt::format("no NumPy dtype for {}", to_string(dtype)));
  }
  return py::array(py::dtype(name), std::vector<py::ssize_t>{static_cast<py::ssize_t>(numel)});
}

}  // namespace dtrain::python
