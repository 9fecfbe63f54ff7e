// dtrain._torch's checkpoints and sampler (python/dtrain/torch/checkpoint.py wraps them): the C++
// CheckpointManager and DistributedSampler, unchanged, for Python modules and optimizers.
//
// The manager works on a C++ Module and Optimizer. A Python model's parameters and buffers are
// LibTorch tensors already, so a shell Module registers those very tensors under the Python names
// (a submodule per dotted prefix): a save reads them, a load writes into them in place. The
// Python optimizer (SGD, Adam or AdamW) is mirrored by the C++ one over the same tensors, its
// hyper-parameters and state copied in before a save and out after a load. So a checkpoint from
// Python is the C++ format (model.safetensors under PyTorch's names, optimizer state, the
// generator, a CRC-checked manifest, written atomically) and each side loads the other's.
// CheckpointOptions and DistributedSamplerOptions are the C++ structs as they are default-
// constructed: checkpoint.py's keyword defaults are read from them, so they are C++'s.
#include <fmt/format.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "dtrain/error.h"
#include "dtrain/torch/checkpoint.h"
#include "dtrain/torch/commit.h"
#include "dtrain/torch/distributed_sampler.h"
#include "python/torch/bindings.h"
#include "python/torch/c10d_backend.h"
#include "torch/optimizer_state.h"

namespace py = pybind11;

namespace dtrain::python {

namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

// A Module whose parameters and buffers are the given tensors, under their dotted names.
std::shared_ptr<torch::nn::Module> shell(const Named& parameters, const Named& buffers) {
  auto root = std::make_shared<torch::nn::Module>();
  auto place = [&](const std::string& name) {
    std::shared_ptr<torch::nn::Module> at = root;
    size_t start = 0;
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', start)) {
      const std::string part = name.substr(start, dot - start);
      auto children = at->named_children();
      if (const auto* child = children.find(part)) {
        at = *child;
      } else {
        at = at->register_module(part, std::make_shared<torch::nn::Module>());
      }
      start = dot + 1;
    }
    return std::make_pair(at, name.substr(start));
  };
  for (const auto& [name, t] : parameters) {
    auto [module, leaf] = place(name);
    module->register_parameter(leaf, t, t.requires_grad());
  }
  for (const auto& [name, t] : buffers) {
    if (!t.defined()) continue;
    auto [module, leaf] = place(name);
    module->register_buffer(leaf, t);
  }
  return root;
}

double number(const py::dict& d, const char* key) {
  if (!d.contains(key))
    throw InvalidArgumentError(
        fmt::format("checkpoint: the optimizer's param group has no '{}'", key));
  return py::cast<double>(d[key]);
}

// The C++ twin of a Python optimizer: same type, groups, hyper-parameters and state, same tensors.
struct OptimizerTwin {
  std::string type;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::vector<std::vector<at::Tensor>> params;  // per group, as in Python
};

template <typename Options>
std::unique_ptr<Options> adam_like(const py::dict& g) {
  auto o = std::make_unique<Options>(number(g, "lr"));
  auto betas = py::cast<std::pair<double, double>>(g["betas"]);
  o->betas(std::make_tuple(betas.first, betas.second));
  o->eps(number(g, "eps"));
  o->weight_decay(number(g, "weight_decay"));
  o->amsgrad(py::cast<bool>(g["amsgrad"]));
  return o;
}

// type: "SGD", "Adam" or "AdamW"; groups: the optimizer's param_groups; state: its state (a dict
// from parameter to a dict of values).
OptimizerTwin twin(const std::string& type, const py::list& groups, const py::dict& state) {
  OptimizerTwin t;
  t.type = type;
  std::vector<torch::optim::OptimizerParamGroup> cpp_groups;
  for (const auto& item : groups) {
    py::dict g = py::reinterpret_borrow<py::dict>(item);
    std::vector<at::Tensor> params = py::cast<std::vector<at::Tensor>>(g["params"]);
    std::unique_ptr<torch::optim::OptimizerOptions> options;
    if (type == "SGD") {
      auto o = std::make_unique<torch::optim::SGDOptions>(number(g, "lr"));
      o->momentum(number(g, "momentum"));
      o->dampening(number(g, "dampening"));
      o->weight_decay(number(g, "weight_decay"));
      o->nesterov(py::cast<bool>(g["nesterov"]));
      options = std::move(o);
    } else if (type == "Adam") {
      options = adam_like<torch::optim::AdamOptions>(g);
    } else if (type == "AdamW") {
      options = adam_like<torch::optim::AdamWOptions>(g);
    } else {
      throw InvalidArgumentError(fmt::format(
          "checkpoint: optimizer {} is not supported (SGD, Adam and AdamW are): its state could "
          "not be restored exactly; use one of those or save its state yourself",
          type));
    }
    t.params.push_back(params);
    cpp_groups.emplace_back(params, std::move(options));
  }
  if (type == "SGD") {
    t.optimizer = std::make_unique<torch::optim::SGD>(cpp_groups, torch::optim::SGDOptions(0.01));
  } else if (type == "Adam") {
    t.optimizer = std::make_unique<torch::optim::Adam>(cpp_groups);
  } else {
    t.optimizer = std::make_unique<torch::optim::AdamW>(cpp_groups);
  }
  for (const auto& group : t.params) {
    for (const auto& p : group) {
      py::object key = py::cast(p);
      if (!state.contains(key)) continue;
      py::dict s = py::reinterpret_borrow<py::dict>(state[key]);
      auto tensor = [&](const char* k) {
        return s.contains(k) && !s[k].is_none() ? py::cast<at::Tensor>(s[k]) : at::Tensor();
      };
      if (type == "SGD") {
        if (!tensor("momentum_buffer").defined()) continue;
        auto st = std::make_unique<torch::optim::SGDParamState>();
        st->momentum_buffer(tensor("momentum_buffer"));
        t.optimizer->state()[optimizer_state::param_key(p)] = std::move(st);
      } else {
        if (!s.contains("step")) continue;
        py::object step = s["step"];  // a tensor in torch 1.13, a number before
        if (py::hasattr(step, "item")) step = step.attr("item")();
        const int64_t steps = py::cast<int64_t>(py::int_(step));
        auto fill = [&](auto st) {
          st->step(steps);
          st->exp_avg(tensor("exp_avg"));
          st->exp_avg_sq(tensor("exp_avg_sq"));
          if (tensor("max_exp_avg_sq").defined()) st->max_exp_avg_sq(tensor("max_exp_avg_sq"));
          t.optimizer->state()[optimizer_state::param_key(p)] = std::move(st);
        };
        if (type == "Adam") {
          fill(std::make_unique<torch::optim::AdamParamState>());
        } else {
          fill(std::make_unique<torch::optim::AdamWParamState>());
        }
      }
    }
  }
  return t;
}

// What a load put into the twin, for Python: per group its hyper-parameters, per parameter (in
// group order) its state.
py::tuple restored(const OptimizerTwin& t) {
  py::list groups, states;
  for (size_t g = 0; g < t.params.size(); ++g) {
    const auto& opts = t.optimizer->param_groups()[g].options();
    py::dict d;
    d["lr"] = opts.get_lr();
    if (t.type == "SGD") {
      const auto& o = static_cast<const torch::optim::SGDOptions&>(opts);
      d["momentum"] = o.momentum();
      d["dampening"] = o.dampening();
      d["weight_decay"] = o.weight_decay();
      d["nesterov"] = o.nesterov();
    } else {
      auto adam = [&](const auto& o) {
        d["betas"] = py::make_tuple(std::get<0>(o.betas()), std::get<1>(o.betas()));
        d["eps"] = o.eps();
        d["weight_decay"] = o.weight_decay();
        d["amsgrad"] = o.amsgrad();
      };
      if (t.type == "Adam") {
        adam(static_cast<const torch::optim::AdamOptions&>(opts));
      } else {
        adam(static_cast<const torch::optim::AdamWOptions&>(opts));
      }
    }
    groups.append(d);
    for (const auto& p : t.params[g]) {
      auto it = t.optimizer->state().find(optimizer_state::param_key(p));
      if (it == t.optimizer->state().end()) {
        states.append(py::none());
        continue;
      }
      py::dict s;
      if (t.type == "SGD") {
        s["momentum_buffer"] =
            static_cast<const torch::optim::SGDParamState&>(*it->second).momentum_buffer();
      } else {
        auto adam = [&](const auto& st) {
          s["step"] = st.step();
          s["exp_avg"] = st.exp_avg();
          s["exp_avg_sq"] = st.exp_avg_sq();
          if (st.max_exp_avg_sq().defined()) s["max_exp_avg_sq"] = st.max_exp_avg_sq();
        };
        if (t.type == "Adam") {
          adam(static_cast<const torch::optim::AdamParamState&>(*it->second));
        } else {
          adam(static_cast<const torch::optim::AdamWParamState&>(*it->second));
        }
      }
      states.append(s);
    }
  }
  return py::make_tuple(groups, states);
}

TrainingProgress progress_of(const py::dict& d) {
  TrainingProgress p;
  p.step = py::cast<int64_t>(d["step"]);
  p.epoch = py::cast<int64_t>(d["epoch"]);
  p.epoch_consumed = py::cast<int64_t>(d["epoch_consumed"]);
  p.epoch_size = py::cast<int64_t>(d["epoch_size"]);
  p.values = py::cast<std::map<std::string, double>>(d["values"]);
  return p;
}

py::dict loaded_dict(const LoadedCheckpoint& c) {
  py::dict d;
  d["path"] = c.path;
  d["step"] = c.progress.step;
  d["epoch"] = c.progress.epoch;
  d["epoch_consumed"] = c.progress.epoch_consumed;
  d["epoch_size"] = c.progress.epoch_size;
  d["world_size"] = c.progress.world_size;
  d["values"] = c.progress.values;
  d["skipped"] = c.skipped;
  return d;
}

}  // namespace

void bind_checkpoints(py::module_& m) {
  // Read-only: only the defaults are of use to Python (the constructors below take every value).
  py::class_<CheckpointOptions>(m, "CheckpointOptions",
                                "dtrain::CheckpointOptions as C++ default-constructs it: the\n"
                                "defaults of dtrain.torch.CheckpointManager's keywords.")
      .def(py::init<>())
      .def_readonly("keep", &CheckpointOptions::keep)
      .def_readonly("writer_rank", &CheckpointOptions::writer_rank)
      .def_readonly("async_write", &CheckpointOptions::async)
      .def_readonly("copy_in_background", &CheckpointOptions::copy_in_background)
      .def_readonly("write_timeout", &CheckpointOptions::write_timeout);
  py::class_<DistributedSamplerOptions>(
      m, "DistributedSamplerOptions",
      "dtrain::DistributedSamplerOptions as C++ default-constructs it: the defaults of\n"
      "dtrain.torch.DistributedSampler's keywords.")
      .def(py::init<>())
      .def_readonly("shuffle", &DistributedSamplerOptions::shuffle)
      .def_readonly("seed", &DistributedSamplerOptions::seed)
      .def_readonly("drop_last", &DistributedSamplerOptions::drop_last);

  py::class_<CheckpointManager>(
      m, "CheckpointManager", "dtrain's C++ CheckpointManager (python/dtrain/torch/checkpoint.py).")
      .def(py::init([](std::string dir, int keep, int writer_rank, bool async_write,
                       bool copy_in_background, std::chrono::milliseconds write_timeout,
                       const c10::intrusive_ptr<c10d::Backend>& group) {
             CheckpointOptions o;
             o.dir = std::move(dir);
             o.keep = keep;
             o.writer_rank = writer_rank;
             o.async = async_write;
             o.copy_in_background = copy_in_background;
             o.write_timeout = write_timeout;
             return std::make_unique<CheckpointManager>(o,
                                                        dtrain_group(group, "CheckpointManager"));
           }),
           py::arg("dir"), py::arg("keep"), py::arg("writer_rank"), py::arg("async_write"),
           py::arg("copy_in_background"), py::arg("write_timeout"), py::arg("group"))
      .def(
          "save",
          [](CheckpointManager& c, const Named& parameters, const Named& buffers,
             const std::string& type, const py::list& groups, const py::dict& state,
             const py::dict& progress) {
            auto module = shell(parameters, buffers);
            std::optional<OptimizerTwin> opt;
            if (!type.empty()) opt = twin(type, groups, state);
            TrainingProgress p = progress_of(progress);
            py::gil_scoped_release release;
            c.save(*module, opt ? opt->optimizer.get() : nullptr, p);
          },
          py::arg("parameters"), py::arg("buffers"), py::arg("optimizer_type"),
          py::arg("param_groups"), py::arg("state"), py::arg("progress"))
      .def(
          "load_latest",
          [](CheckpointManager& c, const Named& parameters, const Named& buffers,
             const std::string& type, const py::list& groups) -> py::object {
            auto module = shell(parameters, buffers);
            std::optional<OptimizerTwin> opt;
            if (!type.empty()) opt = twin(type, groups, py::dict());
            std::optional<LoadedCheckpoint> loaded;
            {
              py::gil_scoped_release release;
              loaded = c.load_latest(*module, opt ? opt->optimizer.get() : nullptr);
            }
            if (!loaded) return py::none();
            py::dict d = loaded_dict(*loaded);
            if (opt) d["optimizer"] = restored(*opt);
            return d;
          },
          py::arg("parameters"), py::arg("buffers"), py::arg("optimizer_type"),
          py::arg("param_groups"))
      .def("wait", &CheckpointManager::wait, py::call_guard<py::gil_scoped_release>())
      .def("wait_copied", &CheckpointManager::wait_copied, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("dir", &CheckpointManager::dir)
      .def_property_readonly("is_writer", &CheckpointManager::is_writer)
      .def("stats", [](const CheckpointManager& c) {
        const CheckpointStats s = c.stats();
        py::dict d;
        d["saves"] = s.saves;
        d["snapshot_ms"] = s.snapshot_ms;
        d["blocked_ms"] = s.blocked_ms;
        d["copy_ms"] = s.copy_ms;
        d["write_ms"] = s.write_ms;
        d["total_blocked_ms"] = s.total_blocked_ms;
        d["bytes"] = s.bytes;
        return d;
      });

  m.def(
      "commit_manager",
      [](const c10::intrusive_ptr<c10d::Backend>& group) -> std::unique_ptr<CheckpointManager> {
        auto pg = dtrain_group(group, "commit_manager");
        auto options = commit_options_from_env(pg.get());
        if (!options) return nullptr;
        return std::make_unique<CheckpointManager>(*options, pg);
      },
      py::arg("group"),
      "The manager of this node's in-memory commits (DTRAIN_COMMIT_DIR, set by an elastic\n"
      "`dtrain run`), written by the node's lowest rank; None when the variable is unset.");
  m.def(
      "resume_newest",
      [](const std::vector<std::pair<CheckpointManager*, std::string>>& sources,
         const c10::intrusive_ptr<c10d::Backend>& group, const Named& parameters,
         const Named& buffers, const std::string& type, const py::list& groups) -> py::object {
        auto module = shell(parameters, buffers);
        std::optional<OptimizerTwin> opt;
        if (!type.empty()) opt = twin(type, groups, py::dict());
        std::vector<ResumeSource> list;
        for (const auto& [manager, kind] : sources) list.push_back({manager, kind});
        auto pg = dtrain_group(group, "resume_newest");
        std::optional<Resumed> resumed;
        {
          py::gil_scoped_release release;
          resumed = resume_newest(list, *module, opt ? opt->optimizer.get() : nullptr, pg.get());
        }
        if (!resumed) return py::none();
        py::dict d = loaded_dict(resumed->checkpoint);
        d["kind"] = resumed->kind;
        d["root"] = resumed->root;
        if (opt) d["optimizer"] = restored(*opt);
        return d;
      },
      py::arg("sources"), py::arg("group"), py::arg("parameters"), py::arg("buffers"),
      py::arg("optimizer_type"), py::arg("param_groups"),
      "Collective: the newest state any rank holds among `sources` (managers and what they\n"
      "are), loaded by the lowest rank holding it and broadcast to all (C++ resume_newest).");

  py::class_<DistributedSampler>(
      m, "DistributedSampler",
      "dtrain's C++ DistributedSampler (python/dtrain/torch/checkpoint.py).")
      .def(py::init<size_t, int, int, bool, uint64_t, bool>(), py::arg("dataset_size"),
           py::arg("num_replicas"), py::arg("rank"), py::arg("shuffle"), py::arg("seed"),
           py::arg("drop_last"))
      .def("set_epoch", &DistributedSampler::set_epoch, py::arg("epoch"), py::arg("consumed") = 0)
      .def_property_readonly("epoch", &DistributedSampler::epoch)
      .def("consumed", py::overload_cast<size_t>(&DistributedSampler::consumed, py::const_),
           py::arg("trained"))
      .def("indices", &DistributedSampler::indices)
      .def("is_padding", &DistributedSampler::is_padding, py::arg("k"))
      .def_property_readonly("num_samples", &DistributedSampler::num_samples);
}

}  // namespace dtrain::python
