// dtrain._torch: the torch.distributed backend "dtrain" (python/dtrain/torch/backend.py registers
// it), the Session under the Horovod-compatible API (python/dtrain/torch/collectives.py), and the
// checkpoints and sampler (checkpoint_bindings.cc).
// Of the backend only the creator is bound: torch's own bindings of Backend and Work call the
// rest through their virtual functions, releasing the GIL as they do for gloo. Every
// blocking call of the Session releases the GIL; waits on the coordinator come back every slice
// so that Python can deliver Ctrl-C between them.
#include <optional>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "comm/backend_registry.h"
#include "comm/cuda_staging.h"
#include "dtrain/error.h"
#include "dtrain/reduce_op.h"
#include "dtrain/torch/broadcast.h"
#include "python/interrupt.h"
#include "python/progress_binding.h"
#include "python/python_site.h"
#include "python/torch/bindings.h"
#include "python/torch/c10d_backend.h"
#include "python/torch/c10d_work.h"
#include "python/torch/session.h"

namespace py = pybind11;
using dtrain::python::AsyncAllreduce;
using dtrain::python::AsyncCall;
using dtrain::python::C10dBackend;
using dtrain::python::Session;
using release = py::call_guard<py::gil_scoped_release>;

namespace {

// A blocking call of the session: GIL released, Ctrl-C aborting it (python/interrupt.h).
template <typename Call>
auto blocking(Session& s, const char* op, const at::Tensor& t, Call&& call) {
  return dtrain::python::run_interruptibly(
      s.group(),
      fmt::format("{} of a {} tensor of {} elements (rank {})", op, c10::toString(t.scalar_type()),
                  t.numel(), s.rank()),
      std::forward<Call>(call));
}

void bind_session(py::module_& m) {
  py::class_<AsyncAllreduce, std::shared_ptr<AsyncAllreduce>>(
      m, "AsyncAllreduce", "An all-reduce queued on the coordinator (or a join).")
      .def("wait_some", &AsyncAllreduce::wait_some, py::arg("slice"), release(),
           "Waits up to `slice`; True once done. Raises the reduction's error.")
      .def("done", &AsyncAllreduce::done)
      .def_property_readonly("tensor", &AsyncAllreduce::tensor)
      .def("last_joined", &AsyncAllreduce::last_joined);

  py::class_<AsyncCall, std::shared_ptr<AsyncCall>>(
      m, "AsyncCall",
      "An allgather, broadcast or alltoall: queued on the coordinator, or done (blocking).")
      .def("wait_some", &AsyncCall::wait_some, py::arg("slice"), release(),
           "Waits up to `slice`; True once done. Raises the call's error.")
      .def("done", &AsyncCall::done)
      .def_property_readonly("output", &AsyncCall::output)
      .def_property_readonly("received", &AsyncCall::received);

  py::class_<dtrain::GradientHooks>(
      m, "GradientHooks",
      "Post hooks on the parameters' gradient accumulators that queue each gradient on the\n"
      "session's coordinator as soon as autograd has it (DistributedOptimizer's engine).")
      .def("submit_missing", &dtrain::GradientHooks::submit_missing, release())
      .def("wait_some", &dtrain::GradientHooks::wait_some, py::arg("slice"), release())
      .def("pending", &dtrain::GradientHooks::pending)
      .def("set_backward_passes_per_step", &dtrain::GradientHooks::set_backward_passes_per_step)
      .def("__len__", &dtrain::GradientHooks::size);

  py::class_<Session>(m, "Session",
                      "What hvd.init() sets up: a group for blocking collectives and a\n"
                      "coordinator for named asynchronous all-reduces.")
      .def(py::init([](const c10::intrusive_ptr<c10d::Backend>& group,
                       std::chrono::microseconds cycle_time, size_t fusion_threshold,
                       std::chrono::milliseconds stall_timeout) {
             dtrain::python::SessionOptions o;
             o.cycle_time = cycle_time;
             o.fusion_threshold_bytes = fusion_threshold;
             o.stall_timeout = stall_timeout;
             auto pg = dtrain::python::dtrain_group(group, "hvd.init");
             if (!pg) throw dtrain::InvalidArgumentError("hvd.init: no group");
             return std::make_unique<Session>(pg, o);
           }),
           py::arg("group"), py::arg("cycle_time"), py::arg("fusion_threshold"),
           py::arg("stall_timeout"), release())
      .def("close", &Session::close, release(),
           "Collective: stops the coordinator (hvd.shutdown()); the session is unusable after.")
      .def_property_readonly("rank", &Session::rank)
      .def_property_readonly("size", &Session::size)
      .def(
          "allreduce_",
          [](Session& s, const at::Tensor& t, const std::string& op, double pre, double post,
             const std::string& name) {
            blocking(s, "allreduce", t,
                     [&] { s.allreduce_(t, dtrain::parse_reduce_op(op), pre, post, name); });
          },
          py::arg("tensor"), py::arg("op"), py::arg("prescale"), py::arg("postscale"),
          py::arg("name") = "")
      .def(
          "broadcast_",
          [](Session& s, const at::Tensor& t, int root, const std::string& name, bool async_op) {
            return blocking(s, "broadcast", t,
                            [&] { return s.broadcast_(t, root, name, async_op); });
          },
          py::arg("tensor"), py::arg("root"), py::arg("name") = "", py::arg("async_op") = false)
      .def(
          "allgather",
          [](Session& s, const at::Tensor& t, const std::string& name, bool async_op) {
            return blocking(s, "allgather", t, [&] { return s.allgather(t, name, async_op); });
          },
          py::arg("tensor"), py::arg("name") = "", py::arg("async_op") = false)
      .def(
          "alltoall",
          [](Session& s, const at::Tensor& t, const std::vector<int64_t>& splits,
             const std::string& name, bool async_op) {
            return blocking(s, "alltoall", t,
                            [&] { return s.alltoall(t, splits, name, async_op); });
          },
          py::arg("tensor"), py::arg("splits"), py::arg("name") = "", py::arg("async_op") = false)
      .def(
          "share_",
          [](Session& s, const std::vector<at::Tensor>& tensors, const std::vector<int>& holders) {
            dtrain::python::run_interruptibly(
                s.group(),
                fmt::format("sharing {} tensor(s) from rank(s) {} (rank {})", tensors.size(),
                            fmt::join(holders, ","), s.rank()),
                [&] { dtrain::share_tensors(*s.group(), tensors, holders); });
          },
          py::arg("tensors"), py::arg("holders"),
          "Collective: the holders' tensors into every rank's, in pieces from each holder where\n"
          "that pays (dtrain::share_tensors); every rank ends with the same bytes.")
      .def("barrier",
           [](Session& s) {
             dtrain::python::run_interruptibly(
                 s.group(), fmt::format("barrier (rank {})", s.rank()), [&] { s.barrier(); });
           })
      .def(
          "allreduce_async_",
          [](Session& s, const at::Tensor& t, const std::string& name, const std::string& op,
             double pre, double post) {
            const dtrain::python::PythonCaller caller;  // while the GIL is held
            py::gil_scoped_release release;
            return s.allreduce_async_(t, name, dtrain::parse_reduce_op(op), pre, post);
          },
          py::arg("tensor"), py::arg("name"), py::arg("op"), py::arg("prescale"),
          py::arg("postscale"))
      .def("join",
           [](Session& s) {
             return dtrain::python::run_interruptibly(
                 s.group(), fmt::format("join (rank {})", s.rank()), [&] { return s.join(); });
           })
      .def(
          "gradient_hooks",
          [](Session& s, std::vector<std::pair<std::string, at::Tensor>> named,
             const std::string& compression, const std::string& op, int passes, double pre,
             double post) {
            dtrain::GradientHooksOptions o;
            o.compression =
                compression == "fp16" ? dtrain::Compression::kFp16 : dtrain::Compression::kNone;
            o.op = dtrain::parse_reduce_op(op);
            o.backward_passes_per_step = passes;
            o.prescale = pre;
            o.postscale = post;
            return s.gradient_hooks(std::move(named), o);
          },
          py::arg("named_parameters"), py::arg("compression"), py::arg("op"),
          py::arg("backward_passes_per_step"), py::arg("prescale"), py::arg("postscale"));
}

}  // namespace

PYBIND11_MODULE(_torch, m) {
  m.doc() = "dtrain's native process group as a torch.distributed backend (torch 2.x)";
  // torch's bindings (Backend, Store, Work) must be known to pybind11 before they are used here.
  py::module_::import("torch.distributed");
  dtrain::python::bind_progress(m);
  // The backend's creator (python/dtrain/torch/backend.py). It returns torch's Backend type: torch
  // binds Backend with its own holder, whose destructor lets go of the GIL, and the object is
  // used through torch's API; dtrain's own calls find the dtrain group under it (dtrain_group).
  m.def(
      "create_backend",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         std::chrono::milliseconds timeout, std::optional<std::string> name,
         std::chrono::milliseconds connect_timeout) -> c10::intrusive_ptr<c10d::Backend> {
        C10dBackend::GroupOptions o;
        if (name) o.name = std::move(*name);  // else GroupOptions' own: the world's name
        o.timeout = timeout;
        o.connect_timeout = connect_timeout;
        return c10::make_intrusive<C10dBackend>(store, rank, size, o);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      py::arg("name") = py::none(), py::arg("connect_timeout") = std::chrono::milliseconds(0),
      // Connecting waits for every member: other Python threads run meanwhile.
      py::call_guard<py::gil_scoped_release>(),
      "A dtrain group as a torch c10d Backend. Made by init_process_group(backend='dtrain') and\n"
      "new_group(); not meant to be called by hand.");
  m.def(
      "is_dtrain_backend",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        return dynamic_cast<C10dBackend*>(backend.get()) != nullptr;
      },
      py::arg("backend"));
  m.def(
      "abort_backend",
      [](const c10::intrusive_ptr<c10d::Backend>& backend, const std::string& reason) {
        dtrain::python::dtrain_group(backend, "abort_backend")->abort(reason);
      },
      py::arg("backend"), py::arg("reason"), py::call_guard<py::gil_scoped_release>(),
      "Fails every pending and later operation of a dtrain backend's group, on this rank and\n"
      "(told by it) on its peers: live recovery's first step, before the group is re-formed.");
  m.def(
      "allreduce_compressed",
      [](const c10::intrusive_ptr<c10d::Backend>& backend, const at::Tensor& tensor,
         const std::string& wire,
         const std::optional<at::Tensor>& error) -> c10::intrusive_ptr<c10d::Work> {
        auto* b = dynamic_cast<C10dBackend*>(backend.get());
        if (b == nullptr)
          throw dtrain::InvalidArgumentError(fmt::format(
              "allreduce_compressed: the group's backend is not dtrain; {} on the wire is "
              "dtrain's own algorithm (init_process_group(\"dtrain\"), or "
              "new_group(backend=\"dtrain\"))",
              wire));
        return b->allreduce_compressed(tensor, dtrain::parse_wire(wire),
                                       error.value_or(at::Tensor()));
      },
      py::arg("backend"), py::arg("tensor"), py::arg("wire"), py::arg("error") = py::none(),
      py::call_guard<py::gil_scoped_release>(),
      "Averages a contiguous f32 tensor over a dtrain group in place, with `wire` on the wire\n"
      "(\"int8\", \"bf16\" or \"fp16\"); `error` (f32, same numel, zeros at first) is its error\n"
      "feedback, kept from call to call. Returns torch's Work. The hooks of\n"
      "dtrain.torch.comm_hooks call it.");
  m.attr("torch_built_for") = DTRAIN_TORCH_BUILT_FOR;
  m.def(
      "backend_version",
      [](const std::string& name) -> std::optional<int> {
        const dtrain::backends::Backend* b = dtrain::backends::built_backend(name);
        if (b == nullptr) return std::nullopt;
        return b->version;
      },
      py::arg("name"),
      "The version code of the library backend `name` (DTRAIN_BACKEND) was built against in this\n"
      "module (nccl: NCCL_VERSION_CODE), 0 when it has none, None when it is not built in.");
  m.def(
      "cuda_built", [] { return dtrain::comm::cuda_staging() != nullptr; },
      "Whether this module moves CUDA tensors (built with the CUDA toolkit).");
  m.def(
      "_quiesce", [] { dtrain::python::FutureCompleter::quiesce_all(std::chrono::seconds(10)); },
      "Waits until no thread of the backend runs a future's callbacks (registered with atexit).",
      py::call_guard<py::gil_scoped_release>());
  bind_session(m);
  dtrain::python::bind_checkpoints(m);
}
