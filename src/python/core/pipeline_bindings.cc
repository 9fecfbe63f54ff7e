// dtrain._core's pipeline pieces for python/dtrain/pipeline.py: the schedules (as lists of
// (op, stage, micro-batch) tuples per rank), the verifier, the cutting of a model into stages,
// and ParallelLayout. Python runs pipelines with torch.distributed.pipelining (docs/pipeline.md).
// Keyword defaults are those of the C++ options structs (ScheduleOptions, Costs,
// ParallelLayoutOptions).
#include <pybind11/stl.h>

#include "dtrain/parallel_layout.h"
#include "dtrain/pipeline/balance.h"
#include "dtrain/pipeline/chart.h"
#include "dtrain/pipeline/schedule.h"
#include "dtrain/pipeline/verifier.h"
#include "python/core/bindings.h"

namespace py = pybind11;

namespace dtrain::python {
namespace {

using namespace dtrain::pipeline;

py::dict to_python(const Schedule& s) {
  py::list ranks;
  for (const auto& list : s.actions) {
    py::list row;
    for (const Action& a : list)
      row.append(py::make_tuple(std::string(to_string(a.op)), a.stage, a.microbatch));
    ranks.append(row);
  }
  py::dict d;
  d["name"] = s.name;
  d["ranks"] = s.ranks;
  d["virtual_stages"] = s.virtual_stages;
  d["microbatches"] = s.microbatches;
  d["actions"] = ranks;
  d["split_backward"] = s.split_backward();
  d["json"] = to_json(s);
  return d;
}

}  // namespace

void bind_pipeline(py::module_& m) {
  m.def(
      "pipeline_schedule",
      [](const std::string& name, int ranks, int microbatches, int virtual_stages) {
        Schedule s = make_schedule({.name = name,
                                    .ranks = ranks,
                                    .microbatches = microbatches,
                                    .virtual_stages = virtual_stages});
        check(s);
        return to_python(s);
      },
      py::arg("name"), py::arg("ranks"), py::arg("microbatches"),
      py::arg("virtual_stages") = ScheduleOptions{}.virtual_stages,
      "A verified schedule: {'name', 'ranks', 'virtual_stages', 'microbatches', 'split_backward',\n"
      "'actions': [[(op, stage, microbatch), ...] per rank], 'json'}.");
  m.def("pipeline_schedules", [] {
    py::list out;
    for (const auto& s : registered_schedules())
      out.append(py::make_tuple(s.name, s.summary, s.interleaved));
    return out;
  });
  m.def(
      "pipeline_verify",
      [](const std::string& json, double forward, double backward_input, double backward_weight,
         double transfer) {
        Schedule s = schedule_from_json(json);
        ScheduleReport r = verify(s, {forward, backward_input, backward_weight, transfer});
        py::dict d;
        d["ok"] = r.ok;
        d["error"] = r.error;
        d["bubble"] = r.bubble;
        d["makespan"] = r.makespan;
        d["busy"] = r.busy;
        d["peak_microbatches"] = r.peak_microbatches;
        d["chart"] = r.ok ? text_chart(s, r) : std::string();
        return d;
      },
      py::arg("json"), py::arg("forward") = Costs{}.forward,
      py::arg("backward_input") = Costs{}.backward_input,
      py::arg("backward_weight") = Costs{}.backward_weight, py::arg("transfer") = Costs{}.transfer,
      "Runs a schedule (its JSON) offline: {'ok', 'error', 'bubble', 'makespan', 'busy',\n"
      "'peak_microbatches', 'chart'}.");
  m.def("pipeline_balance", &balance, py::arg("costs"), py::arg("parts"),
        "Cut points of contiguous parts whose largest cost is the least possible.");

  py::class_<ParallelLayout, std::shared_ptr<ParallelLayout>>(
      m, "ParallelLayout",
      "The ranks as a grid of pipeline stages x data-parallel replicas x tensor-parallel ranks\n"
      "(rank = (stage x replicas + replica) x tensor_parallel + t). Collective over `world`.")
      .def(py::init([](const std::shared_ptr<ProcessGroup>& world, int pipeline_stages,
                       int tensor_parallel) {
             return std::make_shared<ParallelLayout>(
                 world, ParallelLayoutOptions{.pipeline_stages = pipeline_stages,
                                              .tensor_parallel = tensor_parallel});
           }),
           py::arg("world"), py::arg("pipeline_stages") = ParallelLayoutOptions{}.pipeline_stages,
           py::arg("tensor_parallel") = ParallelLayoutOptions{}.tensor_parallel,
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("stage", &ParallelLayout::stage)
      .def_property_readonly("stages", &ParallelLayout::stages)
      .def_property_readonly("replica", &ParallelLayout::replica)
      .def_property_readonly("replicas", &ParallelLayout::replicas)
      .def_property_readonly("world", &ParallelLayout::world)
      .def_property_readonly("pipeline_group", &ParallelLayout::pipeline_group)
      .def_property_readonly("data_group", &ParallelLayout::data_group)
      .def_property_readonly("tensor_rank", &ParallelLayout::tensor_rank)
      .def_property_readonly("tensor_size", &ParallelLayout::tensor_size)
      .def_property_readonly("tensor_group", &ParallelLayout::tensor_group)
      .def("__repr__", &ParallelLayout::describe);
}

}  // namespace dtrain::python
