// dtrain._core: dtrain for Python without torch (python/dtrain/__init__.py and ps.py wrap it).
// Errors arrive as exceptions of dtrain's own classes, which also derive from the built-in class
// a Python programmer would catch: dtrain.InvalidArgumentError is a ValueError,
// dtrain.TimeoutError a TimeoutError, and every one a dtrain.Error (a RuntimeError).
#include <string>

#include <pybind11/pybind11.h>

#include "common/env.h"
#include "dtrain/error.h"
#include "python/core/bindings.h"
#include "python/progress_binding.h"

namespace py = pybind11;

namespace dtrain::python {

void bind_errors(py::module_& m) {
  auto make = [&](const char* name, PyObject* bases, const char* doc) {
    std::string qualified = std::string("dtrain.") + name;
    PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
    if (type == nullptr) throw py::error_already_set();
    m.add_object(name, py::handle(type));
    return type;
  };
  static PyObject* error = make("Error", PyExc_RuntimeError, "Every error dtrain raises.");
  auto with = [](PyObject* a, PyObject* b) {
    return py::make_tuple(py::handle(a), py::handle(b)).release().ptr();
  };
  static PyObject* invalid = make("InvalidArgumentError", with(error, PyExc_ValueError),
                                  "Wrong arguments, or arguments that differ between ranks.");
  static PyObject* timeout = make("TimeoutError", with(error, PyExc_TimeoutError),
                                  "An operation did not finish within its limit.");
  static PyObject* peer = make("PeerFailureError", error, "A peer died or broke its connection.");
  static PyObject* aborted = make("AbortedError", error, "The group was aborted.");
  static PyObject* data_loss = make(
      "DataLossError", error, "Bytes were lost or are corrupt (a failed fsync, EIO, a checksum).");
  static PyObject* exhausted =
      make("ResourceExhaustedError", error, "Out of disk space, quota, descriptors or memory.");
  static PyObject* unavailable =
      make("UnavailableError", error, "Transient: the same call may succeed later.");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgumentError& e) {
      PyErr_SetString(invalid, e.what());
    } catch (const TimeoutError& e) {
      PyErr_SetString(timeout, e.what());
    } catch (const PeerFailureError& e) {
      PyErr_SetString(peer, e.what());
    } catch (const AbortedError& e) {
      PyErr_SetString(aborted, e.what());
    } catch (const DataLossError& e) {
      PyErr_SetString(data_loss, e.what());
    } catch (const ResourceExhaustedError& e) {
      PyErr_SetString(exhausted, e.what());
    } catch (const UnavailableError& e) {
      PyErr_SetString(unavailable, e.what());
    } catch (const Error& e) {
      PyErr_SetString(error, e.what());
    }
  });
}

void bind_environment(py::module_& m) {
  m.def(
      "env_table",
      [] {
        py::list out;
        for (const env::Var& v : env::all())
          out.append(py::make_tuple(std::string(v.name), std::string(v.default_value),
                                    std::string(v.help)));
        return out;
      },
      "[(name, default, help)] of every environment variable dtrain reads, as `dtrain env`\n"
      "lists them (default \"\": unset). The Python layer takes its variables' defaults from it.");
}

}  // namespace dtrain::python

PYBIND11_MODULE(_core, m) {
  m.doc() =
      "dtrain for Python without torch: process groups on NumPy arrays, the parameter server, "
      "sharded data, pipeline schedules";
  dtrain::python::bind_errors(m);
  dtrain::python::bind_environment(m);
  dtrain::python::bind_process_group(m);
  dtrain::python::bind_ps(m);
  dtrain::python::bind_data(m);
  dtrain::python::bind_pipeline(m);
  dtrain::python::bind_progress(m);
  dtrain::python::bind_flight_recorder(m);
  dtrain::python::bind_live(m);
}
