// Tensors to and from safetensors files, through the one reader and writer of the format
// (common/safetensors_file.h).
#include "dtrain/torch/safetensors.h"

#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>

#include "common/safetensors_file.h"
#include "dtrain/error.h"

namespace dtrain {

namespace {

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {at::kFloat, "F32"}, {at::kDouble, "F64"}, {at::kHalf, "F16"},  {at::kBFloat16, "BF16"},
    {at::kChar, "I8"},   {at::kByte, "U8"},    {at::kShort, "I16"}, {at::kInt, "I32"},
    {at::kLong, "I64"},  {at::kBool, "BOOL"},
};

const char* dtype_name(at::ScalarType type, const std::string& tensor) {
  for (const auto& d : kDtypes)
    if (d.type == type) return d.name;
  throw InvalidArgumentError(
      fmt::format("safetensors: tensor '{}' has dtype {}, which the format "
                  "cannot store",
                  tensor, c10::toString(type)));
}

at::ScalarType parse_dtype_name(const std::string& name, const std::string& tensor,
                                const std::string& path) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.type;
  throw InvalidArgumentError(fmt::format(
      "safetensors: {}: tensor '{}' has dtype '{}', which dtrain cannot read", path, tensor, name));
}

std::map<std::string, at::Tensor> module_state(const torch::nn::Module& module) {
  std::map<std::string, at::Tensor> state;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) state[p.key()] = p.value();
  for (const auto& b : module.named_buffers(/*recurse=*/true)) state[b.key()] = b.value();
  return state;
}

}  // namespace

void save_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> held;  // contiguous CPU copies where needed, alive while writing
  std::vector<SafetensorsView> views;
  for (const auto& [name, tensor] : tensors) {
    held.push_back(tensor.detach().cpu().contiguous());
    const at::Tensor& t = held.back();
    views.push_back({name, dtype_name(t.scalar_type(), name), t.sizes().vec(), t.data_ptr(),
                     static_cast<size_t>(t.nbytes())});
  }
  write_safetensors_file(path, views, metadata);
}

std::map<std::string, at::Tensor> load_safetensors(const std::string& path) {
  SafetensorsReader reader(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& e : reader.entries()) {
    at::Tensor t =
        at::empty(e.shape, at::TensorOptions().dtype(parse_dtype_name(e.dtype, e.name, path)));
    reader.read(e, t.data_ptr());  // the reader checked the bytes against dtype and shape
    out.emplace(e.name, std::move(t));
  }
  return out;
}

void save_module_state(const torch::nn::Module& module, const std::string& path) {
  save_safetensors(path, module_state(module), {{"format", "pt"}});
}

void load_module_state(torch::nn::Module& module, const std::string& path) {
  std::map<std::string, at::Tensor> file = load_safetensors(path);
  std::map<std::string, at::Tensor> state = module_state(module);
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [name, t] : state) {
    auto it = file.find(name);
    if (it == file.end()) {
      missing.push_back(name);
    } else if (it->second.sizes() != t.sizes() || it->second.scalar_type() != t.scalar_type()) {
      mismatched.push_back(
          fmt::format("{} (file {} {}, model {} {})", name, c10::toString(it->second.scalar_type()),
                      it->second.sizes().vec(), c10::toString(t.scalar_type()), t.sizes().vec()));
    }
  }
  for (const auto& [name, t] : file)
    if (state.find(name) == state.end()) unexpected.push_back(name);
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty())
    throw InvalidArgumentError(fmt::format(
        "safetensors: {} does not fit the model: missing [{}], unexpected [{}], mismatched [{}]",
        path, fmt::join(missing, ", "), fmt::join(unexpected, ", "), fmt::join(mismatched, "; ")));
  c10::NoGradGuard no_grad;
  for (auto& [name, t] : state) t.copy_(file.at(name));
}

}  // namespace dtrain
