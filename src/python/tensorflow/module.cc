// dtrain._tensorflow: the session under Horovod's TensorFlow API (python/dtrain/tensorflow). The
// same file is the op library (ops.cc) that tf.load_op_library loads first; this module opens
// and closes the session the ops use, and answers rank and size. dtrain's errors reach Python as
// dtrain's exception classes through dtrain._core's translator.
#include <chrono>
#include <optional>
#include <string>

#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "dtrain/error.h"
#include "dtrain/process_group.h"
#include "dtrain/reduce_op.h"
#include "python/tensorflow/session.h"

namespace py = pybind11;
using dtrain::python::tensorflow::Session;
using dtrain::python::tensorflow::SessionOptions;

namespace {

Session& current() {
  static thread_local std::shared_ptr<Session> held;  // keeps it alive for the caller's use
  held = Session::current();
  if (held == nullptr)
    throw dtrain::InvalidArgumentError(
        "dtrain.tensorflow has not been initialized; call dtrain.tensorflow.init() (as hvd.init()) "
        "first");
  return *held;
}

// dtrain's errors as dtrain._core's exception classes (dtrain.InvalidArgumentError, ...), whichever
// pybind11 built that module.
void translate_errors() {
  // Held for the life of the process: a py::object would be released after Python finalized.
  static py::handle core = py::module_::import("dtrain._core").release();
  py::register_local_exception_translator([](std::exception_ptr p) {
    auto raise = [](const char* name, const std::exception& e) {
      PyErr_SetString(core.attr(name).ptr(), e.what());
    };
    try {
      if (p) std::rethrow_exception(p);
    } catch (const dtrain::InvalidArgumentError& e) {
      raise("InvalidArgumentError", e);
    } catch (const dtrain::TimeoutError& e) {
      raise("TimeoutError", e);
    } catch (const dtrain::PeerFailureError& e) {
      raise("PeerFailureError", e);
    } catch (const dtrain::AbortedError& e) {
      raise("AbortedError", e);
    } catch (const dtrain::UnavailableError& e) {
      raise("UnavailableError", e);
    } catch (const dtrain::Error& e) {
      raise("Error", e);
    }
  });
}

}  // namespace

PYBIND11_MODULE(_tensorflow, m) {
  m.doc() = "The session under dtrain.tensorflow's Horovod API; the file is also its op library";
  translate_errors();
  m.attr("built_for") = DTRAIN_TENSORFLOW_BUILT_FOR;
  m.def(
      "init",
      [](std::optional<std::chrono::milliseconds> timeout, std::chrono::microseconds cycle_time,
         size_t fusion_threshold_bytes, std::chrono::milliseconds stall_timeout) {
        if (Session::current() != nullptr) return;
        dtrain::InitOptions o;
        if (timeout) o.group.timeout = *timeout;
        o.group.name = "tensorflow";
        SessionOptions so;
        so.cycle_time = cycle_time;
        so.fusion_threshold_bytes = fusion_threshold_bytes;
        so.stall_timeout = stall_timeout;
        Session::set_current(std::make_shared<Session>(dtrain::init_process_group(o), so));
      },
      py::arg("timeout"), py::arg("cycle_time"), py::arg("fusion_threshold_bytes"),
      py::arg("stall_timeout"), py::call_guard<py::gil_scoped_release>(),
      "Collective: joins the job (rank and size from the launcher) and opens the session.");
  m.def(
      "shutdown",
      [] {
        std::shared_ptr<Session> session = Session::current();
        Session::set_current(nullptr);
        if (session != nullptr) session->close();
      },
      py::call_guard<py::gil_scoped_release>(),
      "Collective: stops the session; init() may open another.");
  m.def("is_initialized", [] { return Session::current() != nullptr; });
  m.def("rank", [] { return current().rank(); });
  m.def("size", [] { return current().size(); });
  m.def(
      "reduce_op",
      [](const std::string& name) { return static_cast<int>(dtrain::parse_reduce_op(name)); },
      py::arg("name"), "dtrain's code of a reduction: 'sum', 'avg', 'min', 'max', 'prod'.");
}
