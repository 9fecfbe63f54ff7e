// The flight recorder from Python: a dump on demand, and the hook through which the dtrain
// package gives it every Python thread's stack (faulthandler writing to a file it reads back).
#include <pybind11/pybind11.h>

#include "comm/flight_recorder.h"
#include "python/core/bindings.h"

namespace py = pybind11;

namespace dtrain::python {

void bind_flight_recorder(py::module_& m) {
  m.def(
      "dump_flight_record",
      [](const std::string& reason) { return comm::FlightRecorder::global().dump(reason); },
      py::arg("reason") = "requested", py::call_guard<py::gil_scoped_release>(),
      "Writes this process's flight record (its last calls and every thread's stack) to "
      "DTRAIN_FLIGHT_DIR/rank<R>.json and returns the path (\"\" when it could not; the log says "
      "why). `dtrain doctor DIR` reads every rank's.");
  m.def(
      "_set_python_stack_dump",
      [](int signal, int fd) { comm::FlightRecorder::global().set_python_stacks(signal, fd); },
      py::arg("signal"), py::arg("fd"));
}

}  // namespace dtrain::python
