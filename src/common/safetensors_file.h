// The safetensors file format over plain bytes (no LibTorch): an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the raw
// little-endian data. dtrain's one reader and writer of it: the parameter server's checkpoints
// (bytes), and through dtrain/torch/safetensors.h the model and optimizer checkpoints (tensors).
// Readable by PyTorch (safetensors.torch.load_file) and Hugging Face tools.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace dtrain {

// Bytes per element of a safetensors dtype ("F32": 4); 0 for a name dtrain does not know.
size_t safetensors_dtype_bytes(const std::string& dtype);

// A tensor to write: its bytes stay where they are.
struct SafetensorsView {
  std::string name;
  std::string dtype;  // "F32", "I64", "U64", ...
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
};

// Writes the file and fsyncs it. Throws the I/O error's kind (common/durable.h) naming the path.
void write_safetensors_file(const std::string& path, const std::vector<SafetensorsView>& tensors,
                            const std::map<std::string, std::string>& metadata = {});

// An open file whose header was read and checked: every entry's dtype is known, its offsets lie
// inside the file and match its dtype and shape. Throws InvalidArgumentError naming the path and
// the entry at fault.
class SafetensorsReader {
 public:
  struct Entry {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t offset = 0;  // in the file
    uint64_t bytes = 0;
  };
  explicit SafetensorsReader(const std::string& path);
  const std::vector<Entry>& entries() const { return entries_; }  // in the header's order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Reads the entry's bytes into `out` (entry.bytes of them).
  void read(const Entry& entry, void* out);

 private:
  std::string path_;
  std::ifstream in_;
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// The whole file in memory, for the parameter server's tables.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
};
void write_safetensors_file(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                            const std::map<std::string, std::string>& metadata = {});
std::vector<SafetensorsEntry> read_safetensors_file(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

}  // namespace dtrain
