// Model state in the safetensors format (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, then the raw
// little-endian data. Readable by PyTorch (safetensors.torch.load_file) and Hugging Face tools,
// and safe to load (no pickle).
//
//   dtrain::save_module_state(*model, "model.safetensors");   // parameters and buffers
//   dtrain::load_module_state(*model, "model.safetensors");
#pragma once

#include <map>
#include <string>

#include <ATen/core/Tensor.h>

namespace torch::nn {
class Module;
}

namespace dtrain {

void save_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
std::map<std::string, at::Tensor> load_safetensors(const std::string& path);

// Every parameter and buffer under its PyTorch name (`layer1.0.weight`, `layer1.1.running_mean`).
void save_module_state(const torch::nn::Module& module, const std::string& path);
// Copies each named tensor of the file into the module. Throws InvalidArgumentError naming the
// tensors missing from the file, unknown to the module, or of another shape or dtype.
void load_module_state(torch::nn::Module& module, const std::string& path);

}  // namespace dtrain
