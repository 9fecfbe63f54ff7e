// dtrain._torch: the torch.distributed backend "dtrain" (python/dtrain/torch/__init__.py
// registers it). Only the constructor is bound: torch's own bindings of ProcessGroup and Work
// call the rest through their virtual functions, releasing the GIL as they do for gloo.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "dtrain/identity.h"
#include "python/torch/c10d_process_group.h"
#include "python/torch/c10d_work.h"

namespace py = pybind11;
using dtrain::python::C10dProcessGroup;

PYBIND11_MODULE(_torch, m) {
  m.doc() = "dtrain's native process group as a torch.distributed backend (torch 1.13)";
  // c10d's ProcessGroup must be known to pybind11 before a class can derive from it.
  py::module_::import("torch.distributed");
  py::class_<C10dProcessGroup, c10d::ProcessGroup, c10::intrusive_ptr<C10dProcessGroup>>(
      m, "ProcessGroup",
      "A dtrain process group behind torch.distributed's ProcessGroup API. Made by\n"
      "init_process_group(backend='dtrain') and new_group(); not meant to be built by hand.")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, std::string name) {
             C10dProcessGroup::Options o;
             o.name = std::move(name);
             o.timeout = timeout;
             return c10::make_intrusive<C10dProcessGroup>(store, rank, size, o);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("name") = "world",
           // Connecting waits for every member: other Python threads run meanwhile.
           py::call_guard<py::gil_scoped_release>());
  m.def(
      "_quiesce",
      [] { dtrain::python::FutureCompleter::quiesce_all(std::chrono::seconds(10)); },
      "Waits until no thread of the backend runs a future's callbacks (registered with atexit).",
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "launcher_identity",
      [] {
        const dtrain::Identity id = dtrain::resolve_identity();
        py::dict d;
        d["rank"] = id.rank;
        d["world_size"] = id.world_size;
        d["local_rank"] = id.local_rank;
        d["local_world_size"] = id.local_world_size;
        d["node_rank"] = id.node_rank;
        d["master_addr"] = id.master_addr;
        d["master_port"] = id.master_port;
        d["source"] = id.source;
        return d;
      },
      "This process's place in the job, from whichever launcher started it (dtrain run, "
      "torchrun, mpirun, srun, a Kubernetes Indexed Job): dtrain's resolve_identity().");
}
