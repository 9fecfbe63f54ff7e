// dtrain._core's parameter-server client (python/dtrain/ps.py wraps it): dtrain::ps::Client on
// NumPy arrays. Every call returns a Handle that keeps its arrays alive until it completed;
// Handle.wait releases the GIL and comes back every 100 ms for Ctrl-C.
#include <fmt/format.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "dtrain/error.h"
#include "dtrain/ps.h"
#include "python/core/array.h"
#include "python/core/bindings.h"

namespace py = pybind11;

namespace dtrain::python {

namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

struct PsHandle {
  ps::Handle handle;
  std::vector<py::object> keep;  // the arrays the call reads or writes

  void wait(std::optional<double> seconds) {
    const milliseconds limit = seconds ? timeout_of(*seconds, "PsHandle.wait") : handle.timeout();
    const auto until = Clock::now() + limit;
    for (;;) {
      const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
      bool done = false;
      {
        py::gil_scoped_release release;
        if (left <= milliseconds(0)) {
          handle.wait(milliseconds(0));  // throws the TimeoutError naming the silent servers
          done = true;
        } else {
          done = handle.wait_for(std::min(left, milliseconds(100)));
        }
      }
      if (done) break;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // Ctrl-C
    }
    keep.clear();
  }
};

ps::OptimizerOptions optimizer(const std::string& kind, float lr, float momentum, float beta1,
                               float beta2, float eps, float weight_decay,
                               float initial_accumulator) {
  ps::OptimizerOptions o;
  if (kind == "sgd") {
    o.kind = ps::OptimizerOptions::Kind::kSgd;
  } else if (kind == "momentum") {
    o.kind = ps::OptimizerOptions::Kind::kMomentum;
  } else if (kind == "adam") {
    o.kind = ps::OptimizerOptions::Kind::kAdam;
  } else if (kind == "adagrad") {
    o.kind = ps::OptimizerOptions::Kind::kAdagrad;
  } else if (kind == "sum") {
    o.kind = ps::OptimizerOptions::Kind::kSum;
  } else {
    throw InvalidArgumentError(
        fmt::format("ps: unknown optimizer '{}'; use sgd, momentum, adam, adagrad or sum", kind));
  }
  o.lr = lr;
  o.momentum = momentum;
  o.beta1 = beta1;
  o.beta2 = beta2;
  o.eps = eps;
  o.weight_decay = weight_decay;
  o.initial_accumulator = initial_accumulator;
  return o;
}

ps::TableOptions table(const ps::OptimizerOptions& opt, const std::string& consistency,
                       uint32_t staleness) {
  ps::TableOptions t;
  t.optimizer = opt;
  if (consistency == "sync") {
    t.consistency = ps::Consistency::kSync;
  } else if (consistency == "async") {
    t.consistency = ps::Consistency::kAsync;
  } else if (consistency == "bounded" || consistency == "ssp") {
    t.consistency = ps::Consistency::kBounded;
  } else {
    throw InvalidArgumentError(
        fmt::format("ps: unknown consistency '{}'; use sync, async or bounded", consistency));
  }
  t.staleness = staleness;
  return t;
}

std::span<const uint64_t> ids_of(const py::buffer& ids, py::buffer_info& info) {
  info = ids.request();
  std::string f = info.format;
  if (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@')) f.erase(0, 1);
  if (info.itemsize != 8 || (f != "Q" && f != "L" && f != "q" && f != "l") || info.ndim != 1 ||
      (info.size > 1 && info.strides[0] != 8))
    throw InvalidArgumentError(fmt::format(
        "ps: ids must be a contiguous one-dimensional array of uint64 or int64, got format '{}' "
        "with {} dimension(s)",
        info.format, info.ndim));
  return {static_cast<const uint64_t*>(info.ptr), static_cast<size_t>(info.size)};
}

}  // namespace

void bind_ps(py::module_& m) {
  py::class_<PsHandle, std::shared_ptr<PsHandle>>(m, "PsHandle",
                                                  "A parameter-server call in flight.")
      .def(
          "wait", &PsHandle::wait, py::arg("timeout") = py::none(),
          "Waits (at most `timeout` seconds, else the client's request timeout); raises the call's "
          "error.")
      .def("done", [](const PsHandle& h) { return h.handle.done(); });

  using Client = ps::Client;
  auto keep = [](ps::Handle h, std::vector<py::object> arrays) {
    return std::make_shared<PsHandle>(PsHandle{std::move(h), std::move(arrays)});
  };
  py::class_<Client, std::unique_ptr<Client>>(
      m, "PsClient",
      "A worker's connection to the parameter servers of a job started with\n"
      "`dtrain run --servers S` (or TF_CONFIG / DMLC_* variables).")
      .def(py::init([] { return Client::from_env(); }), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("worker", &Client::worker)
      .def_property_readonly("num_servers", &Client::num_servers)
      .def(
          "create_dense",
          [](Client& c, const std::string& name, const py::buffer& init, const std::string& kind,
             float lr, float momentum, float beta1, float beta2, float eps, float weight_decay,
             float initial_accumulator, const std::string& consistency, uint32_t staleness) {
            TensorView t = view_of_array(init, false, "create_dense");
            auto options = table(
                optimizer(kind, lr, momentum, beta1, beta2, eps, weight_decay, initial_accumulator),
                consistency, staleness);
            py::gil_scoped_release release;
            c.create_dense(name, t, options);
          },
          py::arg("name"), py::arg("init"), py::arg("optimizer"), py::arg("lr"),
          py::arg("momentum"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
          py::arg("weight_decay"), py::arg("initial_accumulator"), py::arg("consistency"),
          py::arg("staleness"))
      .def(
          "create_sparse",
          [](Client& c, const std::string& name, size_t width, const std::string& init, float a,
             float b, uint64_t seed, const std::string& kind, float lr, float momentum, float beta1,
             float beta2, float eps, float weight_decay, float initial_accumulator,
             const std::string& consistency, uint32_t staleness, int64_t evict_after_s) {
            ps::SparseTableOptions o;
            o.width = width;
            if (init == "zeros") {
              o.init.kind = ps::RowInit::Kind::kZeros;
            } else if (init == "uniform") {
              o.init.kind = ps::RowInit::Kind::kUniform;
            } else if (init == "normal") {
              o.init.kind = ps::RowInit::Kind::kNormal;
            } else {
              throw InvalidArgumentError(
                  fmt::format("ps: unknown row init '{}'; use zeros, uniform or normal", init));
            }
            o.init.a = a;
            o.init.b = b;
            o.init.seed = seed;
            o.table = table(
                optimizer(kind, lr, momentum, beta1, beta2, eps, weight_decay, initial_accumulator),
                consistency, staleness);
            o.evict_after = std::chrono::seconds(evict_after_s);
            py::gil_scoped_release release;
            c.create_sparse(name, o);
          },
          py::arg("name"), py::arg("width"), py::arg("init"), py::arg("a"), py::arg("b"),
          py::arg("seed"), py::arg("optimizer"), py::arg("lr"), py::arg("momentum"),
          py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"),
          py::arg("initial_accumulator"), py::arg("consistency"), py::arg("staleness"),
          py::arg("evict_after_s"))
      .def(
          "push",
          [keep](Client& c, const std::string& name, const py::buffer& grad) {
            TensorView g = view_of_array(grad, false, "push");
            return keep(c.push(name, g), {grad});
          },
          py::arg("name"), py::arg("grad"))
      .def(
          "pull",
          [keep](Client& c, const std::string& name, const py::buffer& out) {
            TensorView o = view_of_array(out, true, "pull");
            return keep(c.pull(name, o), {out});
          },
          py::arg("name"), py::arg("out"))
      .def(
          "push_pull",
          [keep](Client& c, const std::string& name, const py::buffer& grad,
                 const py::buffer& out) {
            TensorView g = view_of_array(grad, false, "push_pull");
            TensorView o = view_of_array(out, true, "push_pull");
            return keep(c.push_pull(name, g, o), {grad, out});
          },
          py::arg("name"), py::arg("grad"), py::arg("out"))
      .def(
          "pull_rows",
          [keep](Client& c, const std::string& name, const py::buffer& ids, const py::buffer& out) {
            py::buffer_info info;
            auto span = ids_of(ids, info);
            TensorView o = view_of_array(out, true, "pull_rows");
            return keep(c.pull_rows(name, span, o), {ids, out});
          },
          py::arg("table"), py::arg("ids"), py::arg("out"))
      .def(
          "push_rows",
          [keep](Client& c, const std::string& name, const py::buffer& ids,
                 const py::buffer& grads) {
            py::buffer_info info;
            auto span = ids_of(ids, info);
            TensorView g = view_of_array(grads, false, "push_rows");
            return keep(c.push_rows(name, span, g), {ids, grads});
          },
          py::arg("table"), py::arg("ids"), py::arg("grads"))
      .def("checkpoint", &Client::checkpoint, py::call_guard<py::gil_scoped_release>());
}

}  // namespace dtrain::python
