// An optimizer's state as named tensors plus a JSON entry (its type, its param groups and their
// hyper-parameters), for checkpoints: SGD (momentum_buffer), Adam and AdamW (step, exp_avg,
// exp_avg_sq, max_exp_avg_sq), under `optimizer.<parameter name>.<state>`. Shared by the
// whole-model checkpoints and the sharded ones, which name their flat shards. Internal to
// dtrain_torch.
#pragma once

#include <functional>
#include <map>
#include <string>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace dtrain::optimizer_state {

using Json = nlohmann::ordered_json;
// Copies a state tensor for saving: (its name, the tensor) -> the copy.
using Copy = std::function<at::Tensor(const std::string& name, const at::Tensor& tensor)>;

enum class OptimizerType { kSgd, kAdam, kAdamW };
// The supported type of `opt`; InvalidArgumentError naming another.
OptimizerType optimizer_type(const torch::optim::Optimizer& opt);
const char* type_name(OptimizerType t);
// The key of a parameter in an optimizer's state().
void* param_key(const at::Tensor& p);

// The names of the module's parameters by tensor identity (the optimizer holds the same tensors).
std::map<const void*, std::string> parameter_names(const torch::nn::Module& module);

// The state of every parameter `names` names, copied into `tensors`; returns the JSON entry.
// A parameter of the optimizer that `names` lacks is an InvalidArgumentError.
Json snapshot_optimizer(const torch::optim::Optimizer& opt,
                        const std::map<const void*, std::string>& names, const Copy& copy,
                        std::map<std::string, at::Tensor>& tensors);
// Restores what snapshot_optimizer saved (`file` holds its tensors). Throws InvalidArgumentError
// when the type, the param groups or the tensors do not fit; `path` names the checkpoint.
void restore_optimizer(const Json& entry, std::map<std::string, at::Tensor> file,
                       torch::optim::Optimizer& opt,
                       const std::map<const void*, std::string>& names, const std::string& path);

}  // namespace dtrain::optimizer_state
