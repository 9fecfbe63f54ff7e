// dtrain._core's ProcessGroup: dtrain's native process group on NumPy arrays (anything with the
// buffer protocol), for Python without torch. Blocking calls run on the calling thread with the
// GIL released and stop on Ctrl-C (python/interrupt.h); isend/irecv return a Work that keeps its
// array alive until it is waited for.
#include <fmt/format.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "dtrain/error.h"
#include "dtrain/identity.h"
#include "dtrain/process_group.h"
#include "python/core/array.h"
#include "python/core/bindings.h"
#include "python/interrupt.h"

namespace py = pybind11;

namespace dtrain::python {

namespace {

using Group = std::shared_ptr<ProcessGroup>;
using std::chrono::milliseconds;

// An operation in flight and the arrays it reads or writes.
struct PyWork {
  std::shared_ptr<Work> work;
  Group group;
  std::string what;
  std::vector<py::object> keep;
};

// A reduction's name as Python gives it ("sum"): the keyword defaults of the collectives are the
// C++ options structs'.
std::string op_name(ReduceOp op) { return std::string(to_string(op)); }

std::string describe(const char* op, const TensorView& t, const ProcessGroup& g) {
  return fmt::format("{} of {} {} on group {} (rank {})", op, t.numel, to_string(t.dtype), g.name(),
                     g.rank());
}

}  // namespace

void bind_process_group(py::module_& m) {
  m.def(
      "launcher_identity",
      [] {
        const Identity id = resolve_identity();
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
  py::class_<PyWork, std::shared_ptr<PyWork>>(m, "Work",
                                              "A send or receive in flight (isend, irecv).")
      .def(
          "wait",
          [](PyWork& w, std::optional<double> seconds) {
            std::optional<milliseconds> timeout;
            if (seconds) timeout = timeout_of(*seconds, "Work.wait");
            run_interruptibly(w.group, w.what, [&] { w.work->wait(timeout); });
            w.keep.clear();
          },
          py::arg("timeout") = py::none(),
          "Waits (at most `timeout` seconds, else the operation's own limit); raises its error.")
      .def("is_completed", [](PyWork& w) { return w.work->is_completed(); })
      .def_property_readonly("source_rank", [](PyWork& w) { return w.work->source_rank(); });

  py::class_<ProcessGroup, Group>(
      m, "ProcessGroup",
      "The ranks of a job and the operations between them, on NumPy arrays. Made by\n"
      "dtrain.init() and new_group(). In-place operations return their array.")
      .def_property_readonly("rank", &ProcessGroup::rank)
      .def_property_readonly("size", &ProcessGroup::size)
      .def_property_readonly("name", &ProcessGroup::name)
      .def(
          "allreduce",
          [](const Group& g, const py::buffer& a, const std::string& op) {
            TensorView t = view_of_array(a, true, "allreduce");
            AllreduceOptions o;
            o.op = parse_reduce_op(op);
            o.async_op = false;
            run_interruptibly(g, describe("allreduce", t, *g), [&] { g->allreduce(t, o)->wait(); });
            return a;
          },
          py::arg("array"), py::arg("op") = op_name(AllreduceOptions{}.op),
          "In place: every rank ends with the reduction (op: sum, prod, min, max, avg, band, "
          "bor, bxor).")
      .def(
          "broadcast",
          [](const Group& g, const py::buffer& a, int root) {
            TensorView t = view_of_array(a, true, "broadcast");
            BroadcastOptions o;
            o.root = root;
            o.async_op = false;
            run_interruptibly(g, describe("broadcast", t, *g), [&] { g->broadcast(t, o)->wait(); });
            return a;
          },
          py::arg("array"), py::arg("root") = BroadcastOptions{}.root,
          "In place: root's array on every rank.")
      .def(
          "reduce",
          [](const Group& g, const py::buffer& a, int root, const std::string& op) {
            TensorView t = view_of_array(a, true, "reduce");
            ReduceOptions o;
            o.root = root;
            o.op = parse_reduce_op(op);
            o.async_op = false;
            run_interruptibly(g, describe("reduce", t, *g), [&] { g->reduce(t, o)->wait(); });
            return a;
          },
          py::arg("array"), py::arg("root") = ReduceOptions{}.root,
          py::arg("op") = op_name(ReduceOptions{}.op),
          "In place at root; other ranks' arrays are left undefined.")
      .def(
          "allgather",
          [](const Group& g, const py::buffer& a) {
            TensorView in = view_of_array(a, false, "allgather");
            py::array out = new_array(in.dtype, in.numel * static_cast<size_t>(g->size()));
            TensorView o = view_of_array(out, true, "allgather");
            AllgatherOptions opt;
            opt.async_op = false;
            run_interruptibly(g, describe("allgather", in, *g),
                              [&] { g->allgather(o, in, opt)->wait(); });
            return out;
          },
          py::arg("array"), "Every rank's array, concatenated in rank order (flat).")
      .def(
          "reduce_scatter",
          [](const Group& g, const py::buffer& a, const std::string& op) {
            TensorView in = view_of_array(a, false, "reduce_scatter");
            const auto n = static_cast<size_t>(g->size());
            if (in.numel % n != 0)
              throw InvalidArgumentError(fmt::format(
                  "reduce_scatter: {} elements do not split into {} equal blocks", in.numel, n));
            py::array out = new_array(in.dtype, in.numel / n);
            TensorView o = view_of_array(out, true, "reduce_scatter");
            ReduceScatterOptions opt;
            opt.op = parse_reduce_op(op);
            opt.async_op = false;
            run_interruptibly(g, describe("reduce_scatter", in, *g),
                              [&] { g->reduce_scatter(o, in, opt)->wait(); });
            return out;
          },
          py::arg("array"), py::arg("op") = op_name(ReduceScatterOptions{}.op),
          "Block `rank` of the reduction of every rank's array (flat, size() blocks).")
      .def(
          "alltoall",
          [](const Group& g, const py::buffer& a) {
            TensorView in = view_of_array(a, false, "alltoall");
            if (in.numel % static_cast<size_t>(g->size()) != 0)
              throw InvalidArgumentError(fmt::format(
                  "alltoall: {} elements do not split into {} equal blocks", in.numel, g->size()));
            py::array out = new_array(in.dtype, in.numel);
            TensorView o = view_of_array(out, true, "alltoall");
            AlltoallOptions opt;
            opt.async_op = false;
            run_interruptibly(g, describe("alltoall", in, *g),
                              [&] { g->alltoall(o, in, opt)->wait(); });
            return out;
          },
          py::arg("array"),
          "Block j of the array goes to rank j; block i of the result came from rank i.")
      .def(
          "gather",
          [](const Group& g, const py::buffer& a, int root) -> py::object {
            TensorView in = view_of_array(a, false, "gather");
            py::array out = new_array(in.dtype, in.numel * static_cast<size_t>(g->size()));
            TensorView o = view_of_array(out, true, "gather");
            GatherOptions opt;
            opt.root = root;
            opt.async_op = false;
            run_interruptibly(g, describe("gather", in, *g),
                              [&] { g->gather(o, in, opt)->wait(); });
            if (g->rank() == root) return out;
            return py::none();
          },
          py::arg("array"), py::arg("root") = GatherOptions{}.root,
          "At root, every rank's array concatenated (flat); None elsewhere.")
      .def(
          "scatter",
          [](const Group& g, const py::buffer& out, const py::object& input, int root) {
            TensorView o = view_of_array(out, true, "scatter");
            TensorView in{nullptr, o.numel * static_cast<size_t>(g->size()), o.dtype};
            std::vector<std::byte> unused;
            if (g->rank() == root) {
              in = view_of_array(input.cast<py::buffer>(), false, "scatter");
            } else {
              unused.resize(in.nbytes());
              in.data = unused.data();
            }
            ScatterOptions opt;
            opt.root = root;
            opt.async_op = false;
            run_interruptibly(g, describe("scatter", o, *g),
                              [&] { g->scatter(o, in, opt)->wait(); });
            return out;
          },
          py::arg("out"), py::arg("array") = py::none(), py::arg("root") = ScatterOptions{}.root,
          "Rank r's `out` gets block r of root's array (root passes it; others may pass None).")
      .def("barrier",
           [](const Group& g) {
             BarrierOptions o;
             o.async_op = false;
             run_interruptibly(g,
                               fmt::format("barrier on group {} (rank {})", g->name(), g->rank()),
                               [&] { g->barrier(o)->wait(); });
           })
      .def(
          "send",
          [](const Group& g, const py::buffer& a, int dst, int tag) {
            TensorView t = view_of_array(a, false, "send");
            run_interruptibly(g, describe("send", t, *g) + fmt::format(" to rank {}", dst),
                              [&] { g->isend(t, dst, tag)->wait(); });
          },
          py::arg("array"), py::arg("dst"), py::arg("tag") = 0)
      .def(
          "recv",
          [](const Group& g, const py::buffer& a, std::optional<int> src, int tag) {
            TensorView t = view_of_array(a, true, "recv");
            return run_interruptibly(
                g,
                describe("recv", t, *g) +
                    (src ? fmt::format(" from rank {}", *src) : " from any rank"),
                [&] {
                  auto w = src ? g->irecv(t, *src, tag) : g->irecv_any(t, tag);
                  w->wait();
                  return w->source_rank() >= 0 ? w->source_rank() : src.value_or(-1);
                });
          },
          py::arg("array"), py::arg("src") = py::none(), py::arg("tag") = 0,
          "Receives into `array` (from any rank when src is None); returns the sender's rank.")
      .def(
          "isend",
          [](const Group& g, const py::buffer& a, int dst, int tag) {
            TensorView t = view_of_array(a, false, "isend");
            return std::make_shared<PyWork>(
                PyWork{g->isend(t, dst, tag), g, describe("isend", t, *g), {a}});
          },
          py::arg("array"), py::arg("dst"), py::arg("tag") = 0)
      .def(
          "irecv",
          [](const Group& g, const py::buffer& a, std::optional<int> src, int tag) {
            TensorView t = view_of_array(a, true, "irecv");
            auto w = src ? g->irecv(t, *src, tag) : g->irecv_any(t, tag);
            return std::make_shared<PyWork>(PyWork{w, g, describe("irecv", t, *g), {a}});
          },
          py::arg("array"), py::arg("src") = py::none(), py::arg("tag") = 0)
      .def(
          "new_group",
          [](const Group& g, const std::vector<int>& ranks) { return g->new_group(ranks); },
          py::arg("ranks"), py::call_guard<py::gil_scoped_release>(),
          "Collective: a group of these ranks (ranks[i] becomes rank i); None on ranks outside.")
      .def("abort", &ProcessGroup::abort, py::arg("reason"),
           "Fails every pending and future operation of the group.");

  m.def(
      "init_process_group",
      [](std::optional<int> rank, std::optional<int> world_size,
         std::optional<std::string> init_method, std::optional<milliseconds> timeout,
         std::optional<std::string> name) {
        InitOptions o;
        o.identity.rank = rank;
        o.identity.world_size = world_size;
        if (init_method) o.identity.init_method = *init_method;
        if (timeout) o.group.timeout = *timeout;
        if (name) o.group.name = *name;
        return init_process_group(o);
      },
      py::arg("rank") = py::none(), py::arg("world_size") = py::none(),
      py::arg("init_method") = py::none(), py::arg("timeout") = py::none(),
      py::arg("name") = py::none(), py::call_guard<py::gil_scoped_release>(),
      "Joins the job: rank and size from the arguments or the launcher (dtrain run, torchrun,\n"
      "mpirun, srun), the rendezvous through MASTER_ADDR/MASTER_PORT (or init_method), then\n"
      "the world group.");
}

}  // namespace dtrain::python
