// dtrain._core's LiveMembership: the survivors' agreement on who goes on after a member died
// (dtrain/live_membership.h), for the Python modules that re-form torch's group on it.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "dtrain/live_membership.h"
#include "python/core/bindings.h"

namespace py = pybind11;

namespace dtrain::python {

void bind_live(py::module_& m) {
  py::class_<LiveMembership>(
      m, "LiveMembership",
      "Who is still in a job run by `dtrain run --live` (generation 0: every rank); next() is\n"
      "the survivors' agreement on the next generation.")
      .def(py::init([](std::chrono::milliseconds settle, std::chrono::milliseconds timeout) {
             return std::make_unique<LiveMembership>(
                 LiveMembershipOptions{.settle = settle, .timeout = timeout});
           }),
           py::arg("settle") = LiveMembershipOptions{}.settle,
           py::arg("timeout") = LiveMembershipOptions{}.timeout,
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("generation", &LiveMembership::generation)
      .def_property_readonly("original_rank", &LiveMembership::original_rank)
      .def_property_readonly("rank", &LiveMembership::rank)
      .def_property_readonly("members", &LiveMembership::members)
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
            py::dict d;
            d["rank"] = n.rank;
            d["size"] = n.size;
            d["lost"] = n.lost;
            d["seconds"] = n.seconds;
            return d;
          },
          "Collective among the survivors: the next generation's members; returns this process's\n"
          "rank and the size in it, the members lost (by rank at start) and the seconds it took.");
}

}  // namespace dtrain::python
