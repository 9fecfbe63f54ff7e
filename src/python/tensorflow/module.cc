// dtrain._tensorflow: the session under Horovod's TensorFlow API (python/dtrain/tensorflow). The
// same file is the op library (ops.cc) that tf.load_op_library loads first; this module opens
// and closes the session the ops use, answers rank and size, and under `dtrain run --live` makes
// the session again on each generation of the live world (hvd.elastic's live recovery). dtrain's
// errors reach Python as dtrain's exception classes through dtrain._core's translator.
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "dtrain/error.h"
#include "dtrain/live_world.h"
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

// Under `dtrain run --live`: the world whose survivors go on, each of its generations with a
// session of its own. Made by init() and never destroyed: its group and store connections go
// with the process (a destructor at exit would run after Python's and the logger's).
std::mutex live_mutex;
dtrain::LiveWorld* live_world = nullptr;  // guarded by live_mutex
SessionOptions live_options;              // init()'s, for the sessions of later generations

dtrain::LiveWorld& live() {
  std::lock_guard lock(live_mutex);
  if (live_world == nullptr)
    throw dtrain::InvalidArgumentError(
        "dtrain.tensorflow: live recovery needs the job to run under `dtrain run --live` and "
        "init() to have joined it");
  return *live_world;
}

// The session of the live world's newest group, in place of the last one.
void open_session(const std::shared_ptr<dtrain::ProcessGroup>& group) {
  Session::set_current(std::make_shared<Session>(group, live_options));
}

py::dict dict_of(const dtrain::LiveWorld::Reformed& r, const dtrain::LiveWorld& world) {
  py::dict d;
  d["rank"] = r.group->rank();
  d["size"] = r.group->size();
  d["generation"] = world.generation();
  d["lost"] = r.lost;
  d["joined"] = r.joined;
  d["seconds"] = r.seconds;
  d["rejoined"] = r.rejoined;
  return d;
}

}  // namespace

PYBIND11_MODULE(_tensorflow, m) {
  m.doc() = "The session under dtrain.tensorflow's Horovod API; the file is also its op library";
  translate_errors();
  m.attr("built_for") = DTRAIN_TENSORFLOW_BUILT_FOR;
  m.def(
      "init",
      [](std::optional<std::chrono::milliseconds> timeout, std::chrono::microseconds cycle_time,
         size_t fusion_threshold_bytes, std::chrono::milliseconds stall_timeout, bool live) {
        if (Session::current() != nullptr) return true;
        dtrain::InitOptions o;
        if (timeout) o.group.timeout = *timeout;
        o.group.name = "tensorflow";
        SessionOptions so;
        so.cycle_time = cycle_time;
        so.fusion_threshold_bytes = fusion_threshold_bytes;
        so.stall_timeout = stall_timeout;
        if (!live) {
          Session::set_current(std::make_shared<Session>(dtrain::init_process_group(o), so));
          return true;
        }
        std::lock_guard lock(live_mutex);
        live_options = so;
        if (live_world == nullptr) {
          dtrain::LiveWorldOptions lo;
          lo.group = o.group;
          // A replacement's returns once the members took it in, or ended training first.
          live_world = new dtrain::LiveWorld(lo);
        }
        if (live_world->too_late()) return false;
        open_session(live_world->group());
        return true;
      },
      py::arg("timeout"), py::arg("cycle_time"), py::arg("fusion_threshold_bytes"),
      py::arg("stall_timeout"), py::arg("live") = false, py::call_guard<py::gil_scoped_release>(),
      "Collective: joins the job (rank and size from the launcher) and opens the session. With\n"
      "live (under `dtrain run --live`), the job's live world; False for a replacement whose\n"
      "members ended training before taking it in (there is nothing to do).");
  m.def(
      "reform",
      [] {
        dtrain::LiveWorld& world = live();
        dtrain::LiveWorld::Reformed r;
        {
          py::gil_scoped_release release;
          if (std::shared_ptr<Session> old = Session::current()) {
            // First, so that the coordinator's thread stops waiting on the group.
            old->world()->abort("the group is being re-formed after a member's failure");
            Session::set_current(nullptr);
            old->close();
          }
          r = world.reform();
          open_session(r.group);
        }
        return dict_of(r, world);
      },
      "Collective among the survivors of a member's death: aborts the session and its group,\n"
      "agrees on who goes on (dtrain::LiveWorld) and opens the session on their group. A dict:\n"
      "rank, size, generation, lost and joined (ranks at start), seconds, rejoined (this\n"
      "process was left out and taken in again: its state is stale).");
  m.def(
      "admit_waiting",
      []() -> std::optional<py::dict> {
        dtrain::LiveWorld& world = live();
        std::optional<dtrain::LiveWorld::Reformed> r;
        {
          py::gil_scoped_release release;
          r = world.admit_waiting();
          if (r) {
            if (std::shared_ptr<Session> old = Session::current()) {
              Session::set_current(nullptr);
              old->close();  // collective among the members, who are all here
            }
            open_session(r->group);
          }
        }
        if (!r) return std::nullopt;
        return dict_of(*r, world);
      },
      "Collective among the members, at a step boundary: replacements waiting for dead members\n"
      "are taken in and the session is opened on the grown group (reform()'s dict); None, with\n"
      "nothing sent, while no member is missing.");
  m.def(
      "live_ended", [](std::chrono::milliseconds wait) { return live().ended(wait); },
      py::arg("wait"), py::call_guard<py::gil_scoped_release>(),
      "The members the launcher reports ended (ranks at start), waiting up to `wait` for one.");
  m.def(
      "live_close", [] { live().close(); }, py::call_guard<py::gil_scoped_release>(),
      "Training is over: replacements still waiting are told so.");
  m.def(
      "live_status",
      [] {
        const dtrain::LiveWorld& world = live();
        py::dict d;
        d["generation"] = world.generation();
        d["original_rank"] = world.original_rank();
        d["size_at_start"] = world.size_at_start();
        d["replacement"] = world.replacement();
        d["members"] = world.members();
        return d;
      },
      "The live world: generation, original_rank, size_at_start, replacement, members.");
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
