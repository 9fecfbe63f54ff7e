// The safetensors file format over plain bytes (no LibTorch): an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the raw
// little-endian data. What the parameter server's checkpoints are written in, readable by
// PyTorch (safetensors.torch.load_file) and Hugging Face tools.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtrain {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "I64", "U64", ...
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
};

// Writes the file and fsyncs it. Throws InvalidArgumentError naming the path on failure.
void write_safetensors_file(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                            const std::map<std::string, std::string>& metadata = {});
// Reads and validates every entry (offsets inside the file, sizes matching dtype and shape);
// throws InvalidArgumentError naming the path and the entry at fault.
std::vector<SafetensorsEntry> read_safetensors_file(const std::string& path,
                                                    std::map<std::string, std::string>* metadata =
                                                        nullptr);

}  // namespace dtrain
