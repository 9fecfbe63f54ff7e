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

// The names Python gives the enums, both ways: a value's name is the first listed for it.
template <typename E>
struct Named {
  const char* name;
  E value;
};
constexpr Named<ps::OptimizerOptions::Kind> kOptimizers[] = {
    {"sgd", ps::OptimizerOptions::Kind::kSgd},
    {"momentum", ps::OptimizerOptions::Kind::kMomentum},
    {"adam", ps::OptimizerOptions::Kind::kAdam},
    {"adagrad", ps::OptimizerOptions::Kind::kAdagrad},
    {"sum", ps::OptimizerOptions::Kind::kSum}};
constexpr Named<ps::Consistency> kConsistencies[] = {{"sync", ps::Consistency::kSync},
                                                     {"async", ps::Consistency::kAsync},
                                                     {"bounded", ps::Consistency::kBounded},
                                                     {"ssp", ps::Consistency::kBounded}};
constexpr Named<ps::RowInit::Kind> kRowInits[] = {{"zeros", ps::RowInit::Kind::kZeros},
                                                  {"uniform", ps::RowInit::Kind::kUniform},
                                                  {"normal", ps::RowInit::Kind::kNormal}};

// `what` and `choices` word the error: "ps: unknown optimizer 'x'; use sgd, ...".
template <typename E, size_t N>
E parse(const Named<E> (&names)[N], const std::string& text, const char* what,
        const char* choices) {
  for (const auto& n : names)
    if (text == n.name) return n.value;
  throw InvalidArgumentError(fmt::format("ps: unknown {} '{}'; use {}", what, text, choices));
}

template <typename E, size_t N>
const char* name_of(const Named<E> (&names)[N], E value) {
  for (const auto& n : names)
    if (n.value == value) return n.name;
  return "unknown";
}

// A float option as Python would write it (0.01, not 0.009999999776482582): its shortest
// decimal form, which converts back to the same float.
py::float_ to_python(float value) { return py::float_(py::str(fmt::format("{}", value))); }

ps::OptimizerOptions optimizer(const std::string& kind, float lr, float momentum, float beta1,
                               float beta2, float eps, float weight_decay,
                               float initial_accumulator) {
  ps::OptimizerOptions o;
  o.kind = parse(kOptimizers, kind, "optimizer", "sgd, momentum, adam, adagrad or sum");
  o.lr = lr;
  o.momentum = momentum;
  o.beta1 = beta1;
  o.beta2 = beta2;
  o.eps = eps;
  o.weight_decay = weight_decay;
  o.initial_accumulator = initial_accumulator;
  return o;
}

// The float options of an optimizer under the names create_dense and create_sparse take.
py::dict optimizer_options(const ps::OptimizerOptions& o) {
  py::dict d;
  d["lr"] = to_python(o.lr);
  d["momentum"] = to_python(o.momentum);
  d["beta1"] = to_python(o.beta1);
  d["beta2"] = to_python(o.beta2);
  d["eps"] = to_python(o.eps);
  d["weight_decay"] = to_python(o.weight_decay);
  d["initial_accumulator"] = to_python(o.initial_accumulator);
  return d;
}

ps::TableOptions table(const ps::OptimizerOptions& opt, const std::string& consistency,
                       uint32_t staleness) {
  ps::TableOptions t;
  t.optimizer = opt;
  t.consistency = parse(kConsistencies, consistency, "consistency", "sync, async or bounded");
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
  // Read-only: only the defaults are of use to Python (create_dense and create_sparse take every
  // value).
  py::class_<ps::TableOptions>(m, "PsTableOptions",
                               "dtrain::ps::TableOptions as C++ default-constructs it: the\n"
                               "defaults of dtrain.ps.Client.create_dense's keywords.")
      .def(py::init<>())
      .def_property_readonly(
          "optimizer",
          [](const ps::TableOptions& t) { return name_of(kOptimizers, t.optimizer.kind); })
      .def_property_readonly(
          "optimizer_options",
          [](const ps::TableOptions& t) { return optimizer_options(t.optimizer); },
          "{name: value} of the optimizer's options (lr, momentum, beta1, ...).")
      .def_property_readonly(
          "consistency",
          [](const ps::TableOptions& t) { return name_of(kConsistencies, t.consistency); })
      .def_readonly("staleness", &ps::TableOptions::staleness);
  py::class_<ps::SparseTableOptions>(
      m, "PsSparseTableOptions",
      "dtrain::ps::SparseTableOptions as C++ default-constructs it: the defaults of\n"
      "dtrain.ps.Client.create_sparse's keywords.")
      .def(py::init<>())
      .def_property_readonly(
          "init", [](const ps::SparseTableOptions& o) { return name_of(kRowInits, o.init.kind); })
      .def_property_readonly("a",
                             [](const ps::SparseTableOptions& o) { return to_python(o.init.a); })
      .def_property_readonly("b",
                             [](const ps::SparseTableOptions& o) { return to_python(o.init.b); })
      .def_property_readonly("seed", [](const ps::SparseTableOptions& o) { return o.init.seed; })
      .def_property_readonly("evict_after_s",
                             [](const ps::SparseTableOptions& o) {
                               return static_cast<int64_t>(o.evict_after.count());
                             })
      .def_readonly("table", &ps::SparseTableOptions::table);

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
            o.init.kind = parse(kRowInits, init, "row init", "zeros, uniform or normal");
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
