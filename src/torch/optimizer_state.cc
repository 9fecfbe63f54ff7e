// Optimizer state as named tensors and JSON: see optimizer_state.h.
#include "torch/optimizer_state.h"

#include <cxxabi.h>

#include <cstdlib>
#include <typeinfo>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include "dtrain/error.h"

namespace dtrain::optimizer_state {

namespace {

std::string demangled(const std::type_info& type) {
  int status = 0;
  char* name = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name != nullptr ? name : type.name();
  std::free(name);
  return out;
}

template <typename Options>
Json adam_options(const Options& o) {
  return {{"lr", o.lr()},
          {"betas", {std::get<0>(o.betas()), std::get<1>(o.betas())}},
          {"eps", o.eps()},
          {"weight_decay", o.weight_decay()},
          {"amsgrad", o.amsgrad()}};
}

template <typename Options>
void set_adam_options(Options& o, const Json& j) {
  o.lr(j.at("lr").get<double>());
  o.betas(std::make_tuple(j.at("betas").at(0).get<double>(), j.at("betas").at(1).get<double>()));
  o.eps(j.at("eps").get<double>());
  o.weight_decay(j.at("weight_decay").get<double>());
  o.amsgrad(j.at("amsgrad").get<bool>());
}

template <typename State>
void snapshot_adam_state(const State& s, const std::string& prefix, const Copy& copy,
                         std::map<std::string, at::Tensor>& out) {
  out[prefix + "step"] = at::tensor(s.step(), at::kLong);
  for (const auto& [key, t] : {std::pair<const char*, const at::Tensor&>{"exp_avg", s.exp_avg()},
                               {"exp_avg_sq", s.exp_avg_sq()},
                               {"max_exp_avg_sq", s.max_exp_avg_sq()}})
    if (t.defined()) out[prefix + key] = copy(prefix + key, t);
}

std::string name_of(const std::map<const void*, std::string>& names, const at::Tensor& p,
                    size_t group, size_t index) {
  auto it = names.find(p.unsafeGetTensorImpl());
  if (it == names.end())
    throw InvalidArgumentError(fmt::format(
        "checkpoint: parameter {} of the optimizer's param group {} (shape {}) is not a parameter "
        "of the module; optimizer state is stored under the module's parameter names, so give the "
        "optimizer the module's parameters",
        index, group, p.sizes().vec()));
  return it->second;
}

template <typename State>
std::unique_ptr<torch::optim::OptimizerParamState> adam_state(
    const std::string& prefix, std::map<std::string, at::Tensor>& file, const at::Tensor& p) {
  auto take = [&](const std::string& key) {
    auto node = file.extract(prefix + key);
    return node.empty() ? at::Tensor() : node.mapped().to(p.device());
  };
  at::Tensor step = take("step");
  at::Tensor exp_avg = take("exp_avg"), exp_avg_sq = take("exp_avg_sq"),
             max_sq = take("max_exp_avg_sq");
  if (!step.defined() && !exp_avg.defined()) return nullptr;
  if (!step.defined() || !exp_avg.defined() || !exp_avg_sq.defined())
    throw InvalidArgumentError(
        fmt::format("checkpoint: the optimizer state of '{}' is incomplete (needs step, exp_avg "
                    "and exp_avg_sq)",
                    prefix.substr(10, prefix.size() - 11)));
  auto s = std::make_unique<State>();
  s->step(step.item<int64_t>());
  s->exp_avg(exp_avg);
  s->exp_avg_sq(exp_avg_sq);
  if (max_sq.defined()) s->max_exp_avg_sq(max_sq);
  return s;
}

}  // namespace

void* param_key(const at::Tensor& p) { return p.unsafeGetTensorImpl(); }

OptimizerType optimizer_type(const torch::optim::Optimizer& opt) {
  if (dynamic_cast<const torch::optim::SGD*>(&opt) != nullptr) return OptimizerType::kSgd;
  if (dynamic_cast<const torch::optim::Adam*>(&opt) != nullptr) return OptimizerType::kAdam;
  if (dynamic_cast<const torch::optim::AdamW*>(&opt) != nullptr) return OptimizerType::kAdamW;
  throw InvalidArgumentError(fmt::format(
      "checkpoint: optimizer {} is not supported (SGD, Adam and AdamW are): its state could not be "
      "restored exactly; use one of those or save its state yourself",
      demangled(typeid(opt))));
}

const char* type_name(OptimizerType t) {
  switch (t) {
    case OptimizerType::kSgd:
      return "SGD";
    case OptimizerType::kAdam:
      return "Adam";
    case OptimizerType::kAdamW:
      return "AdamW";
  }
  return "?";
}

// Names of the module's parameters by tensor identity (the optimizer holds the same tensors).
std::map<const void*, std::string> parameter_names(const torch::nn::Module& module) {
  std::map<const void*, std::string> names;
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    names[p.value().unsafeGetTensorImpl()] = p.key();
  return names;
}

// The manifest's "optimizer" entry, and its state tensors under optimizer.<param>.<state>.
Json snapshot_optimizer(const torch::optim::Optimizer& opt,
                        const std::map<const void*, std::string>& names, const Copy& copy,
                        std::map<std::string, at::Tensor>& tensors) {
  const OptimizerType type = optimizer_type(opt);
  Json groups = Json::array();
  for (size_t g = 0; g < opt.param_groups().size(); ++g) {
    const auto& group = opt.param_groups()[g];
    Json params = Json::array();
    for (size_t i = 0; i < group.params().size(); ++i) {
      const at::Tensor& p = group.params()[i];
      const std::string name = name_of(names, p, g, i);
      params.push_back(name);
      auto it = opt.state().find(param_key(p));
      if (it == opt.state().end()) continue;  // no step taken with it yet
      const std::string prefix = "optimizer." + name + ".";
      if (type == OptimizerType::kSgd) {
        const auto& s = static_cast<const torch::optim::SGDParamState&>(*it->second);
        if (s.momentum_buffer().defined())
          tensors[prefix + "momentum_buffer"] =
              copy(prefix + "momentum_buffer", s.momentum_buffer());
      } else if (type == OptimizerType::kAdam) {
        snapshot_adam_state(static_cast<const torch::optim::AdamParamState&>(*it->second), prefix,
                            copy, tensors);
      } else {
        snapshot_adam_state(static_cast<const torch::optim::AdamWParamState&>(*it->second), prefix,
                            copy, tensors);
      }
    }
    Json options;
    if (type == OptimizerType::kSgd) {
      const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
      options = {{"lr", o.lr()},
                 {"momentum", o.momentum()},
                 {"dampening", o.dampening()},
                 {"weight_decay", o.weight_decay()},
                 {"nesterov", o.nesterov()}};
    } else if (type == OptimizerType::kAdam) {
      options = adam_options(static_cast<const torch::optim::AdamOptions&>(group.options()));
    } else {
      options = adam_options(static_cast<const torch::optim::AdamWOptions&>(group.options()));
    }
    groups.push_back({{"params", params}, {"options", options}});
  }
  return {{"type", type_name(type)}, {"param_groups", groups}};
}

void restore_optimizer(const Json& entry, std::map<std::string, at::Tensor> file,
                       torch::optim::Optimizer& opt,
                       const std::map<const void*, std::string>& names, const std::string& path) {
  const OptimizerType type = optimizer_type(opt);
  const std::string saved_type = entry.at("type").get<std::string>();
  if (saved_type != type_name(type))
    throw InvalidArgumentError(fmt::format(
        "checkpoint {} holds the state of a {} optimizer, but the optimizer to restore is {}; "
        "resume with the optimizer the run was started with",
        path, saved_type, type_name(type)));
  const Json& groups = entry.at("param_groups");
  if (groups.size() != opt.param_groups().size())
    throw InvalidArgumentError(
        fmt::format("checkpoint {} holds {} optimizer param groups, the optimizer has {}", path,
                    groups.size(), opt.param_groups().size()));
  for (size_t g = 0; g < groups.size(); ++g) {
    auto& group = opt.param_groups()[g];
    std::vector<std::string> mine;
    for (size_t i = 0; i < group.params().size(); ++i)
      mine.push_back(name_of(names, group.params()[i], g, i));
    auto saved = groups[g].at("params").get<std::vector<std::string>>();
    if (saved != mine)
      throw InvalidArgumentError(
          fmt::format("checkpoint {}: optimizer param group {} held parameters [{}], the optimizer "
                      "now has [{}]",
                      path, g, fmt::join(saved, ", "), fmt::join(mine, ", ")));
    const Json& o = groups[g].at("options");
    if (type == OptimizerType::kSgd) {
      auto& so = static_cast<torch::optim::SGDOptions&>(group.options());
      so.lr(o.at("lr").get<double>());
      so.momentum(o.at("momentum").get<double>());
      so.dampening(o.at("dampening").get<double>());
      so.weight_decay(o.at("weight_decay").get<double>());
      so.nesterov(o.at("nesterov").get<bool>());
    } else if (type == OptimizerType::kAdam) {
      set_adam_options(static_cast<torch::optim::AdamOptions&>(group.options()), o);
    } else {
      set_adam_options(static_cast<torch::optim::AdamWOptions&>(group.options()), o);
    }
    for (size_t i = 0; i < group.params().size(); ++i) {
      const at::Tensor& p = group.params()[i];
      const std::string prefix = "optimizer." + mine[i] + ".";
      std::unique_ptr<torch::optim::OptimizerParamState> state;
      if (type == OptimizerType::kSgd) {
        auto node = file.extract(prefix + "momentum_buffer");
        if (!node.empty()) {
          auto s = std::make_unique<torch::optim::SGDParamState>();
          s->momentum_buffer(node.mapped().to(p.device()));
          state = std::move(s);
        }
      } else if (type == OptimizerType::kAdam) {
        state = adam_state<torch::optim::AdamParamState>(prefix, file, p);
      } else {
        state = adam_state<torch::optim::AdamWParamState>(prefix, file, p);
      }
      if (state) {
        opt.state()[param_key(p)] = std::move(state);
      } else {
        opt.state().erase(param_key(p));  // the parameter had no state yet when saved
      }
    }
  }
  if (!file.empty()) {
    std::vector<std::string> left;
    for (const auto& [name, t] : file) left.push_back(name);
    throw InvalidArgumentError(
        fmt::format("checkpoint {}: optimizer state for tensors the optimizer does not have: [{}]",
                    path, fmt::join(left, ", ")));
  }
}

}  // namespace dtrain::optimizer_state
