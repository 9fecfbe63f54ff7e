// The parts of the extension dtrain._core (src/python/core/module.cc binds them in this order).
#pragma once

#include <pybind11/pybind11.h>

namespace dtrain::python {

void bind_errors(pybind11::module_& m);
void bind_environment(pybind11::module_& m);
void bind_process_group(pybind11::module_& m);
void bind_ps(pybind11::module_& m);
void bind_data(pybind11::module_& m);
void bind_pipeline(pybind11::module_& m);
void bind_flight_recorder(pybind11::module_& m);
void bind_live(pybind11::module_& m);

}  // namespace dtrain::python
