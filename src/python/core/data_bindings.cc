// dtrain._core's ShardedDataset (python/dtrain/data.py wraps it): dtrain::data::ShardedDataset,
// whose records reach Python as bytes. next() releases the GIL and comes back every 100 ms for
// Ctrl-C; the reader threads never touch Python. ShardedDatasetOptions is the C++ struct as it
// is default-constructed: data.py's keyword defaults are read from it, so they are C++'s.
#include <fmt/format.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "dtrain/data/sharded_dataset.h"
#include "dtrain/error.h"
#include "python/core/bindings.h"

namespace py = pybind11;

namespace dtrain::python {

namespace {

using data::ShardedDataset;

// on_bad_record's names, both ways.
struct OnBadRecordName {
  const char* name;
  data::OnBadRecord value;
};
constexpr OnBadRecordName kOnBadRecordNames[] = {{"fail", data::OnBadRecord::kFail},
                                                 {"skip", data::OnBadRecord::kSkip}};

data::OnBadRecord parse_on_bad_record(const std::string& name) {
  for (const auto& n : kOnBadRecordNames)
    if (name == n.name) return n.value;
  throw InvalidArgumentError(
      fmt::format("ShardedDataset: on_bad_record='{}': use 'fail' or 'skip'", name));
}

const char* name_of(data::OnBadRecord value) {
  for (const auto& n : kOnBadRecordNames)
    if (n.value == value) return n.name;
  return "unknown";
}

// (bytes, shard, index, id, key, parts), or None at the end of the epoch; parts is a list of
// (name, offset, size) for tar samples, empty for TFRecord records.
py::object next_record(ShardedDataset& dataset) {
  data::Record r;
  for (;;) {
    ShardedDataset::Fetch got;
    {
      py::gil_scoped_release release;
      got = dataset.try_next(std::chrono::milliseconds(100), r);
    }
    if (got == ShardedDataset::Fetch::kEnd) return py::none();
    if (got == ShardedDataset::Fetch::kRecord) break;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // Ctrl-C
  }
  py::bytes bytes(reinterpret_cast<const char*>(r.bytes.data()), r.bytes.size());
  py::list parts;
  for (const auto& p : r.parts) parts.append(py::make_tuple(p.name, p.offset, p.size));
  return py::make_tuple(bytes, r.shard, r.index, r.id, r.key, parts);
}

}  // namespace

void bind_data(py::module_& m) {
  using Options = data::ShardedDatasetOptions;
  // Read-only: only the defaults are of use to Python (the constructor below takes every value).
  py::class_<Options>(m, "ShardedDatasetOptions",
                      "dtrain::data::ShardedDatasetOptions as C++ default-constructs it: the\n"
                      "defaults of dtrain.data.ShardedDataset's keywords.")
      .def(py::init<>())
      .def_readonly("seed", &Options::seed)
      .def_readonly("shuffle", &Options::shuffle)
      .def_readonly("shuffle_window", &Options::shuffle_window)
      .def_readonly("drop_last", &Options::drop_last)
      .def_readonly("readers", &Options::readers)
      .def_readonly("prefetch_records", &Options::prefetch_records)
      .def_readonly("prefetch_bytes", &Options::prefetch_bytes)
      .def_property_readonly("on_bad_record",
                             [](const Options& o) { return name_of(o.on_bad_record); });

  py::class_<ShardedDataset>(m, "ShardedDataset")
      .def(py::init([](std::vector<std::string> shards, int rank, int world_size, uint64_t seed,
                       bool shuffle, uint64_t shuffle_window, bool drop_last, int readers,
                       size_t prefetch_records, size_t prefetch_bytes, const std::string& on_bad,
                       std::optional<double> timeout) {
             Options o;
             o.rank = rank;
             o.world_size = world_size;
             o.seed = seed;
             o.shuffle = shuffle;
             o.shuffle_window = shuffle_window;
             o.drop_last = drop_last;
             o.readers = readers;
             o.prefetch_records = prefetch_records;
             o.prefetch_bytes = prefetch_bytes;
             o.on_bad_record = parse_on_bad_record(on_bad);
             if (timeout) {
               if (!(*timeout > 0) || *timeout > 1e9)
                 throw InvalidArgumentError(fmt::format(
                     "ShardedDataset: timeout={} s: give a positive number of seconds", *timeout));
               o.timeout = std::chrono::milliseconds(static_cast<int64_t>(*timeout * 1000));
             }
             py::gil_scoped_release release;  // counting the records of many files takes a while
             return std::make_unique<ShardedDataset>(std::move(shards), std::move(o));
           }),
           py::arg("shards"), py::arg("rank"), py::arg("world_size"), py::arg("seed"),
           py::arg("shuffle"), py::arg("shuffle_window"), py::arg("drop_last"), py::arg("readers"),
           py::arg("prefetch_records"), py::arg("prefetch_bytes"), py::arg("on_bad_record"),
           py::arg("timeout"))
      .def("set_epoch", &ShardedDataset::set_epoch, py::arg("epoch"), py::arg("consumed") = 0)
      .def("regroup", &ShardedDataset::regroup, py::arg("rank"), py::arg("world_size"))
      .def("is_padding", &ShardedDataset::is_padding, py::arg("k"))
      .def("next", &next_record)
      .def("consumed", py::overload_cast<uint64_t>(&ShardedDataset::consumed, py::const_),
           py::arg("taken"))
      .def_property_readonly("epoch", &ShardedDataset::epoch)
      .def_property_readonly("size", &ShardedDataset::size)
      .def_property_readonly("num_samples", &ShardedDataset::num_samples)
      .def_property_readonly("shards", &ShardedDataset::shards)
      .def_property_readonly("skipped", &ShardedDataset::skipped);
}

}  // namespace dtrain::python
