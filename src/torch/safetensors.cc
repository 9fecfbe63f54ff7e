// safetensors reader and writer (format in dtrain/torch/safetensors.h).
#include "dtrain/torch/safetensors.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include "dtrain/error.h"

namespace dtrain {

namespace {

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {at::kFloat, "F32"}, {at::kDouble, "F64"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"},
    {at::kChar, "I8"},   {at::kByte, "U8"},    {at::kShort, "I16"}, {at::kInt, "I32"},
    {at::kLong, "I64"},  {at::kBool, "BOOL"},
};

const char* dtype_name(at::ScalarType type, const std::string& tensor) {
  for (const auto& d : kDtypes)
    if (d.type == type) return d.name;
  throw InvalidArgumentError(fmt::format("safetensors: tensor '{}' has dtype {}, which the format "
                                         "cannot store",
                                         tensor, c10::toString(type)));
}

at::ScalarType parse_dtype_name(const std::string& name, const std::string& tensor,
                                const std::string& path) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.type;
  throw InvalidArgumentError(
      fmt::format("safetensors: {}: tensor '{}' has dtype '{}', which dtrain cannot read", path,
                  tensor, name));
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
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    at::Tensor t = tensor.detach().cpu().contiguous();
    uint64_t bytes = static_cast<uint64_t>(t.nbytes());
    header[name] = {{"dtype", dtype_name(t.scalar_type(), name)},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(t);
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // the format pads the header to 8 bytes
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw InvalidArgumentError(
      fmt::format("safetensors: cannot write {}: {}", path, std::strerror(errno)));
  uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& t : data)
    out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  out.close();  // the buffered tail reaches the disk here: a full disk fails now, not silently
  if (!out) throw InvalidArgumentError(
      fmt::format("safetensors: writing {} failed: {}", path, std::strerror(errno)));
}

std::map<std::string, at::Tensor> load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgumentError(
      fmt::format("safetensors: cannot open {}: {}", path, std::strerror(errno)));
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  unsigned char len[8] = {};
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{len[i]} << (8 * i);
  if (!in || n > file_size - 8)
    throw InvalidArgumentError(fmt::format(
        "safetensors: {} is not a safetensors file (header length {} in a file of {} bytes)",
        path, n, file_size));
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object())
    throw InvalidArgumentError(fmt::format("safetensors: {}: the header is not a JSON object", path));
  const uint64_t data_start = 8 + n;
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    at::ScalarType type = parse_dtype_name(entry.at("dtype").get<std::string>(), name, path);
    std::vector<int64_t> shape = entry.at("shape").get<std::vector<int64_t>>();
    auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
    if (offsets.size() != 2 || offsets[1] - offsets[0] != static_cast<uint64_t>(t.nbytes()) ||
        data_start + offsets[1] > file_size)
      throw InvalidArgumentError(fmt::format(
          "safetensors: {}: tensor '{}' of shape {} and dtype {} needs {} bytes but its offsets "
          "are {} (file of {} bytes)",
          path, name, shape, c10::toString(type), t.nbytes(), offsets, file_size));
    in.seekg(static_cast<std::streamoff>(data_start + offsets[0]));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    if (!in)
      throw InvalidArgumentError(fmt::format("safetensors: {}: reading '{}' failed: {}", path,
                                             name, std::strerror(errno)));
    out.emplace(name, std::move(t));
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
      mismatched.push_back(fmt::format("{} (file {} {}, model {} {})", name,
                                       c10::toString(it->second.scalar_type()),
                                       it->second.sizes().vec(), c10::toString(t.scalar_type()),
                                       t.sizes().vec()));
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
