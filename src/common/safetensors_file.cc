#include "common/safetensors_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/byte_order.h"
#include "common/durable.h"
#include "common/socket.h"
#include "dtrain/error.h"

namespace dtrain {

size_t safetensors_dtype_bytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

namespace {

void write_fd(int fd, const void* data, size_t size, const std::string& path) {
  auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) durable::throw_io(n < 0 ? errno : EIO, "safetensors: writing", path);
    p += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

void write_safetensors_file(const std::string& path, const std::vector<SafetensorsView>& tensors,
                            const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // the format pads the header to 8 bytes
  net::Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) durable::throw_io(errno, "safetensors: creating", path);
  const uint64_t n = text.size();
  unsigned char len[8];
  store_le(len, n);
  write_fd(fd.get(), len, 8, path);
  write_fd(fd.get(), text.data(), text.size(), path);
  for (const auto& t : tensors) write_fd(fd.get(), t.data, t.bytes, path);
  if (::fsync(fd.get()) != 0)
    throw DataLossError(
        fmt::format("safetensors: fsync of {} failed: {}: what was written may not be on the disk",
                    path, durable::errno_text(errno)));
}

SafetensorsReader::SafetensorsReader(const std::string& path)
    : path_(path), in_(path, std::ios::binary) {
  if (!in_) durable::throw_io(errno, "safetensors: opening", path);
  in_.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in_.tellg());
  in_.seekg(0);
  unsigned char len[8] = {};
  in_.read(reinterpret_cast<char*>(len), 8);
  const uint64_t n = load_le<uint64_t>(len);
  if (!in_ || file_size < 8 || n > file_size - 8)
    throw InvalidArgumentError(fmt::format(
        "safetensors: {} is truncated or not a safetensors file (header length {} in a file of "
        "{} bytes)",
        path, n, file_size));
  std::string text(n, '\0');
  in_.read(text.data(), static_cast<std::streamsize>(n));
  nlohmann::ordered_json header =
      nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object())
    throw InvalidArgumentError(
        fmt::format("safetensors: {}: the header is not a JSON object", path));
  const uint64_t data_start = 8 + n;
  try {
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        metadata_ = entry.get<std::map<std::string, std::string>>();
        continue;
      }
      Entry e;
      e.name = name;
      e.dtype = entry.at("dtype").get<std::string>();
      e.shape = entry.at("shape").get<std::vector<int64_t>>();
      const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
      const size_t unit = safetensors_dtype_bytes(e.dtype);
      if (unit == 0)
        throw InvalidArgumentError(
            fmt::format("safetensors: {}: tensor '{}' has dtype '{}', which dtrain cannot read",
                        path, name, e.dtype));
      uint64_t elements = 1;
      for (int64_t d : e.shape) {
        if (d < 0 || (d > 0 && elements > file_size / static_cast<uint64_t>(d)))
          throw InvalidArgumentError(fmt::format(
              "safetensors: {}: tensor '{}' has shape {} that cannot fit in a file of {} bytes",
              path, name, fmt::join(e.shape, "x"), file_size));
        elements *= static_cast<uint64_t>(d);
      }
      if (offsets.size() != 2 || offsets[1] < offsets[0] ||
          offsets[1] - offsets[0] != elements * unit || offsets[1] > file_size - data_start)
        throw InvalidArgumentError(fmt::format(
            "safetensors: {}: tensor '{}' ({} of {} elements) has data offsets [{}, {}] that do "
            "not fit its size or the file's {} bytes (truncated?)",
            path, name, e.dtype, elements, offsets.empty() ? 0 : offsets[0],
            offsets.size() < 2 ? 0 : offsets[1], file_size));
      e.offset = data_start + offsets[0];
      e.bytes = offsets[1] - offsets[0];
      entries_.push_back(std::move(e));
    }
  } catch (const nlohmann::json::exception& ex) {
    throw InvalidArgumentError(
        fmt::format("safetensors: {}: malformed header: {}", path, ex.what()));
  }
}

void SafetensorsReader::read(const Entry& entry, void* out) {
  in_.seekg(static_cast<std::streamoff>(entry.offset));
  in_.read(static_cast<char*>(out), static_cast<std::streamsize>(entry.bytes));
  if (!in_) {
    const int err = errno;
    in_.clear();
    durable::throw_io(err != 0 ? err : EIO,
                      fmt::format("safetensors: reading '{}' from", entry.name), path_);
  }
}

void write_safetensors_file(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                            const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsView> views;
  for (const auto& e : entries)
    views.push_back({e.name, e.dtype, e.shape, e.data.data(), e.data.size()});
  write_safetensors_file(path, views, metadata);
}

std::vector<SafetensorsEntry> read_safetensors_file(const std::string& path,
                                                    std::map<std::string, std::string>* metadata) {
  SafetensorsReader reader(path);
  if (metadata) *metadata = reader.metadata();
  std::vector<SafetensorsEntry> out;
  for (const auto& e : reader.entries()) {
    SafetensorsEntry entry{e.name, e.dtype, e.shape, std::vector<std::byte>(e.bytes)};
    reader.read(e, entry.data.data());
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace dtrain
