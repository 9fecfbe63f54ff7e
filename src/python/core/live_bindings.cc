// dtrain._core's LiveMembership: the survivors' agreement on who goes on after a member died
// (dtrain/live_membership.h), for the Python modules that re-form torch's group on it.
#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "comm/spare_place.h"
#include "common/env.h"
#include "dtrain/error.h"
#include "dtrain/live_membership.h"
#include "dtrain/step_shape.h"
#include "python/core/bindings.h"

namespace py = pybind11;

namespace dtrain::python {
namespace {

py::dict dict_of(const LiveMembership::Next& n) {
  py::dict d;
  d["rank"] = n.rank;
  d["size"] = n.size;
  d["lost"] = n.lost;
  d["rejoined"] = n.rejoined;
  d["seconds"] = n.seconds;
  return d;
}

}  // namespace

void bind_live(py::module_& m) {
  py::class_<LiveMembership>(
      m, "LiveMembership",
      "Who is still in a job run by `dtrain run --live` (generation 0: every rank); next() is\n"
      "the survivors' agreement on the next generation.")
      // A replacement's (DTRAIN_LIVE_REPLACEMENT=1) returns once the members took it in.
      .def(py::init([](std::chrono::milliseconds settle, std::chrono::milliseconds timeout) {
             return std::make_unique<LiveMembership>(
                 LiveMembershipOptions{.settle = settle, .timeout = timeout});
           }),
           py::arg("settle") = LiveMembershipOptions{}.settle,
           py::arg("timeout") = LiveMembershipOptions{}.timeout,
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("generation", &LiveMembership::generation)
      .def_property_readonly("original_rank", &LiveMembership::original_rank)
      .def_property_readonly("size_at_start", &LiveMembership::size_at_start)
      .def_property_readonly("rank", &LiveMembership::rank)
      .def_property_readonly("members", &LiveMembership::members)
      .def_property_readonly("replacement", &LiveMembership::replacement)
      .def_property_readonly("spare", &LiveMembership::spare)
      .def_property_readonly("too_late", &LiveMembership::too_late)
      .def("missing", &LiveMembership::missing)
      .def("waiting", &LiveMembership::waiting, py::call_guard<py::gil_scoped_release>(),
           "Of the missing ranks, those whose replacement asks to be taken in (store lookups, at\n"
           "most every 100 ms; [] in between).")
      .def("close", &LiveMembership::close, py::call_guard<py::gil_scoped_release>(),
           "No more newcomers: training is over.")
      .def("ended", &LiveMembership::ended, py::arg("wait"),
           py::call_guard<py::gil_scoped_release>(),
           "The members the launcher reports ended (by rank at start), waiting up to `wait` for\n"
           "one.")
      .def(
          "next",
          [](LiveMembership& self) {
            LiveMembership::Next n;
            {
              py::gil_scoped_release release;
              n = self.next();
            }
            return dict_of(n);
          },
          "Collective among the survivors: the next generation's members; returns this process's\n"
          "rank and the size in it, the members lost (by rank at start) and the seconds it took.")
      .def(
          "admit",
          [](LiveMembership& self, const std::vector<int>& joiners) {
            LiveMembership::Next n;
            {
              py::gil_scoped_release release;
              n = self.admit(joiners);
            }
            return dict_of(n);
          },
          py::arg("joiners"),
          "Collective among the members, each with the same `joiners`: the next generation takes\n"
          "them in.")
      .def(
          "form",
          [](LiveMembership& self, int rank, int size, const py::function& make) {
            LiveMembership::Formed f;
            {
              py::gil_scoped_release release;
              f = self.form({.rank = rank, .size = size}, [&](const LiveMembership::Next& at) {
                py::gil_scoped_acquire gil;
                try {
                  make(at.rank, at.size);
                } catch (py::error_already_set& e) {
                  // The loop goes on without the GIL: the error's text, taken while it is held.
                  throw PeerFailureError(e.what());
                }
              });
            }
            py::dict d = dict_of(f.place);
            d["lost"] = f.lost;
            d["rejoined"] = f.rejoined;
            return d;
          },
          py::arg("rank"), py::arg("size"), py::arg("make"),
          "Forms the newest generation's world, this process `rank` of `size`: make(rank, size)\n"
          "forms it; while it raises (a member died after the list closed), the survivors agree\n"
          "again and make() is called at the new place. Returns the place, with the members\n"
          "lost and whether this process was taken back meanwhile.");
  m.def(
      "step_shape",
      [](const std::string& on_resize, int64_t batch_per_rank, double learning_rate,
         int size_at_start, int size) {
        const StepShape s =
            step_shape(parse_on_resize(on_resize),
                       {.batch_per_rank = batch_per_rank, .learning_rate = learning_rate},
                       size_at_start, size);
        return py::make_tuple(s.batch_per_rank, s.learning_rate);
      },
      py::arg("on_resize"), py::arg("batch_per_rank"), py::arg("learning_rate"),
      py::arg("size_at_start"), py::arg("size"),
      "(batch per rank, learning rate) at `size` ranks for a job that started with these at\n"
      "`size_at_start` (include/dtrain/step_shape.h).");
  m.def(
      "spare_place_given",
      [](int spare) {
        const std::string dir = env::get_string(env::kFlightDir);
        return !dir.empty() && comm::read_spare_place(dir, spare).has_value();
      },
      py::arg("spare"),
      "Whether the launcher has given spare `spare` its place (comm/spare_place.h): a dead\n"
      "worker's rank, which the others train without until the spare takes it.");
}

}  // namespace dtrain::python
