// dtrain._core's pipeline pieces for python/dtrain/pipeline.py: the schedules (as lists of
// (op, stage, micro-batch) tuples per rank), the verifier, the message header the C++ runner
// speaks, and ParallelLayout. The runner itself is Python (its stages are torch modules); what it
// runs and what it sends are these.
#include <fmt/format.h>
#include <pybind11/stl.h>

#include "dtrain/error.h"
#include "dtrain/parallel_layout.h"
#include "dtrain/pipeline/chart.h"
#include "dtrain/pipeline/schedule.h"
#include "dtrain/pipeline/verifier.h"
#include "pipeline/message.h"
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
      py::arg("name"), py::arg("ranks"), py::arg("microbatches"), py::arg("virtual_stages") = 1,
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
      py::arg("json"), py::arg("forward") = 1.0, py::arg("backward_input") = 1.0,
      py::arg("backward_weight") = 1.0, py::arg("transfer") = 0.0,
      "Runs a schedule (its JSON) offline: {'ok', 'error', 'bubble', 'makespan', 'busy',\n"
      "'peak_microbatches', 'chart'}.");
  m.def(
      "pipeline_encode_header",
      [](int direction, int stage, int microbatch, int64_t step, int microbatches,
         uint32_t schedule_id, const std::string& dtype, const std::vector<int64_t>& shape) {
        if (direction != 1 && direction != 2)
          throw InvalidArgumentError(
              fmt::format("pipeline: direction {} is not 1 or 2", direction));
        MessageHeader h;
        h.direction = static_cast<Direction>(direction);
        h.stage = stage;
        h.microbatch = microbatch;
        h.step = step;
        h.microbatches = microbatches;
        h.schedule_id = schedule_id;
        h.dtype = parse_dtype(dtype);
        h.shape = shape;
        auto bytes = encode(h);
        return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      },
      py::arg("direction"), py::arg("stage"), py::arg("microbatch"), py::arg("step"),
      py::arg("microbatches"), py::arg("schedule_id"), py::arg("dtype"), py::arg("shape"));
  m.def(
      "pipeline_decode_header",
      [](const py::buffer& b) {
        py::buffer_info info = b.request();
        MessageHeader h =
            decode(std::span<const std::byte>(static_cast<const std::byte*>(info.ptr),
                                              static_cast<size_t>(info.size * info.itemsize)));
        return py::make_tuple(static_cast<int>(h.direction), h.stage, h.microbatch, h.step,
                              h.microbatches, h.schedule_id, std::string(to_string(h.dtype)),
                              h.shape, describe(h));
      },
      py::arg("header"),
      "(direction, stage, microbatch, step, microbatches, schedule_id, dtype, shape, text)");
  m.def("pipeline_schedule_id", &schedule_id, py::arg("name"), py::arg("ranks"),
        py::arg("virtual_stages"));
  m.def(
      "pipeline_message_tag",
      [](int direction, int stage, int microbatch, int stages) {
        return message_tag(static_cast<Direction>(direction), stage, microbatch, stages);
      },
      py::arg("direction"), py::arg("stage"), py::arg("microbatch"), py::arg("stages"));
  m.attr("PIPELINE_HEADER_BYTES") = kHeaderBytes;

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
           py::arg("world"), py::arg("pipeline_stages") = 1, py::arg("tensor_parallel") = 1,
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
