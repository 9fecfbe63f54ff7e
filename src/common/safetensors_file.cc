#include "common/safetensors_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dtrain/error.h"

namespace dtrain {

namespace {

size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

void write_fd(int fd, const void* data, size_t size, const std::string& path) {
  auto* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw InvalidArgumentError(
          fmt::format("safetensors: writing {} failed: {}", path, std::strerror(errno)));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

void write_safetensors_file(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                            const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& e : entries) {
    header[e.name] = {{"dtype", e.dtype},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.data.size()}}};
    offset += e.data.size();
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw InvalidArgumentError(
        fmt::format("safetensors: cannot create {}: {}", path, std::strerror(errno)));
  try {
    uint64_t n = text.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    write_fd(fd, len, 8, path);
    write_fd(fd, text.data(), text.size(), path);
    for (const auto& e : entries) write_fd(fd, e.data.data(), e.data.size(), path);
    if (::fsync(fd) != 0)
      throw InvalidArgumentError(
          fmt::format("safetensors: fsync of {} failed: {}", path, std::strerror(errno)));
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

std::vector<SafetensorsEntry> read_safetensors_file(const std::string& path,
                                                    std::map<std::string, std::string>* metadata) {
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
  if (!in || file_size < 8 || n > file_size - 8)
    throw InvalidArgumentError(fmt::format(
        "safetensors: {} is truncated or not a safetensors file (header length {} in a file of "
        "{} bytes)",
        path, n, file_size));
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object())
    throw InvalidArgumentError(fmt::format("safetensors: {}: the header is not a JSON object", path));
  const uint64_t data_start = 8 + n;
  std::vector<SafetensorsEntry> out;
  try {
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        if (metadata) *metadata = entry.get<std::map<std::string, std::string>>();
        continue;
      }
      SafetensorsEntry e;
      e.name = name;
      e.dtype = entry.at("dtype").get<std::string>();
      e.shape = entry.at("shape").get<std::vector<int64_t>>();
      auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
      uint64_t elements = 1;
      for (int64_t d : e.shape) elements *= static_cast<uint64_t>(d);
      const size_t unit = dtype_bytes(e.dtype);
      if (unit == 0 || offsets.size() != 2 || offsets[1] < offsets[0] ||
          offsets[1] - offsets[0] != elements * unit || data_start + offsets[1] > file_size)
        throw InvalidArgumentError(fmt::format(
            "safetensors: {}: tensor '{}' ({} of {} elements) has data offsets [{}, {}] that do "
            "not fit its size or the file's {} bytes (truncated?)",
            path, name, e.dtype, elements, offsets.empty() ? 0 : offsets[0],
            offsets.size() < 2 ? 0 : offsets[1], file_size));
      e.data.resize(offsets[1] - offsets[0]);
      in.seekg(static_cast<std::streamoff>(data_start + offsets[0]));
      in.read(reinterpret_cast<char*>(e.data.data()), static_cast<std::streamsize>(e.data.size()));
      if (!in)
        throw InvalidArgumentError(fmt::format("safetensors: {}: reading '{}' failed: {}", path,
                                               name, std::strerror(errno)));
      out.push_back(std::move(e));
    }
  } catch (const nlohmann::json::exception& ex) {
    throw InvalidArgumentError(fmt::format("safetensors: {}: malformed header: {}", path, ex.what()));
  }
  return out;
}

}  // namespace dtrain
