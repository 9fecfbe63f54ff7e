// ProgressReporter and announce_resumed for Python (include/dtrain/progress.h), bound in both
// extensions: as dtrain.ProgressReporter (_core) and dtrain.torch.ProgressReporter (_torch). Each
// extension has
// its own copy of the library, so each counts the waits of its own process groups: a script that
// communicates through torch.distributed uses dtrain.torch's.
#pragma once

#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>

#include "dtrain/progress.h"

namespace dtrain::python {

inline void bind_progress(pybind11::module_& m) {
  namespace py = pybind11;
  // module_local: each extension registers its own copy of the class.
  py::class_<ProgressReporter>(
      m, "ProgressReporter", py::module_local(),
      "Reports each training step to `dtrain run --metrics-port` (`dtrain docs metrics`): step,\n"
      "samples/s, and the step's time split into compute and communication (the time spent\n"
      "waiting for this library's collectives). Does nothing outside such a run.\n\n"
      "    progress = ProgressReporter(rank)\n"
      "    progress.step(step, 0)               # starts the clock\n"
      "    for ...: train; progress.step(step, len(batch))")
      .def(py::init([](int rank, std::chrono::milliseconds interval) {
             return new ProgressReporter(rank, ProgressOptions{.interval = interval});
           }),
           py::arg("rank"), py::arg("interval") = ProgressOptions{}.interval)
      .def("step", &ProgressReporter::step, py::arg("step"), py::arg("samples"),
           "Step `step` ended now, having trained `samples` samples on this rank.")
      .def_property_readonly("active", &ProgressReporter::active,
                             "Whether a launcher collects the reports (DTRAIN_PROGRESS_DIR).");
  m.def("announce_resumed", &announce_resumed, py::arg("rank"), py::arg("what"),
        py::call_guard<py::gil_scoped_release>(),
        "Tells `dtrain run` (elastic) where this job resumed from (`what`: \"from step 120\"):\n"
        "it reports \"round R: rank N resumed from step 120, training again S s after ...\".\n"
        "Does nothing outside such a run.");
}

}  // namespace dtrain::python
