// Arrays from Python (NumPy arrays, or anything with the buffer protocol) as dtrain tensors:
// zero-copy views of C-contiguous memory, and new NumPy arrays for the results.
#pragma once

#include <chrono>
#include <string>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "dtrain/tensor.h"

namespace dtrain::python {

// A view of `array`'s memory. Throws InvalidArgumentError (naming `what`) unless it is
// C-contiguous, of a dtype dtrain communicates, and writable when `writable`.
TensorView view_of_array(const pybind11::buffer& array, bool writable, const char* what);

// `seconds` from Python as a timeout; InvalidArgumentError (naming `what`) unless finite and
// between 0 and a year.
std::chrono::milliseconds timeout_of(double seconds, const char* what);

// A new NumPy array of `numel` elements of `dtype`.
pybind11::array new_array(DType dtype, size_t numel);

}  // namespace dtrain::python
