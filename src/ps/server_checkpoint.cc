#include "ps/server_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "common/json_integer.h"
#include "common/log.h"
#include "dtrain/error.h"

namespace dtrain::ps {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "ckpt-";

uint32_t file_crc(const fs::path& path, uint64_t* size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgumentError(
      fmt::format("cannot read {}: {}", path.string(), std::strerror(errno)));
  std::vector<char> buf(1 << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  *size = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    std::streamsize n = in.gcount();
    if (n <= 0) break;
    crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(n));
    *size += static_cast<uint64_t>(n);
  }
  return static_cast<uint32_t>(crc);
}

void fsync_path(const fs::path& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Checkpoint numbers present in dir, newest first.
std::vector<uint64_t> list(const fs::path& dir) {
  std::vector<uint64_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0 || !e.is_directory()) continue;
    try {
      out.push_back(std::stoull(name.substr(std::char_traits<char>::length(kPrefix))));
    } catch (...) {
    }
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

fs::path checkpoint_path(const fs::path& dir, uint64_t n) {
  return dir / fmt::format("{}{:06d}", kPrefix, n);
}

}  // namespace

std::string write_checkpoint(const std::string& dir_text, CheckpointData data, int keep) {
  const fs::path dir(dir_text);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw InvalidArgumentError(
        fmt::format("checkpoint: cannot create {}: {}", dir.string(), ec.message()));
  auto existing = list(dir);
  const uint64_t n = existing.empty() ? 1 : existing.front() + 1;
  const fs::path tmp = dir / fmt::format(".{}{:06d}.tmp-{}", kPrefix, n, ::getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec)
    throw InvalidArgumentError(
        fmt::format("checkpoint: cannot create {}: {}", tmp.string(), ec.message()));

  const fs::path tensors = tmp / "tables.safetensors";
  write_safetensors_file(tensors.string(), data.tensors);
  uint64_t size = 0;
  const uint32_t crc = file_crc(tensors, &size);
  data.manifest["files"] = {{"tables.safetensors", {{"crc32", crc}, {"bytes", size}}}};
  {
    const fs::path manifest = tmp / "manifest.json";
    std::ofstream out(manifest);
    out << data.manifest.dump(2) << "\n";
    out.close();
    if (!out)
      throw InvalidArgumentError(fmt::format("checkpoint: writing {} failed: {}",
                                             manifest.string(), std::strerror(errno)));
    fsync_path(manifest, O_RDONLY);
  }
  fsync_path(tmp, O_RDONLY | O_DIRECTORY);
  const fs::path final_path = checkpoint_path(dir, n);
  fs::rename(tmp, final_path, ec);
  if (ec)
    throw InvalidArgumentError(fmt::format("checkpoint: renaming {} to {} failed: {}", tmp.string(),
                                           final_path.string(), ec.message()));
  fsync_path(dir, O_RDONLY | O_DIRECTORY);
  // Keep the newest `keep`.
  auto all = list(dir);
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < all.size(); ++i)
    fs::remove_all(checkpoint_path(dir, all[i]), ec);
  return final_path.string();
}

std::optional<std::pair<std::string, CheckpointData>> read_latest_checkpoint(
    const std::string& dir_text) {
  const fs::path dir(dir_text);
  std::error_code ec;
  // Temporary directories of a save that never finished are garbage.
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind(std::string(".") + kPrefix, 0) == 0) {
      DTRAIN_LOG_WARN("ps checkpoint: removing {}, left by a save that did not finish",
                      e.path().string());
      fs::remove_all(e.path(), ec);
    }
  }
  for (uint64_t n : list(dir)) {
    const fs::path path = checkpoint_path(dir, n);
    try {
      std::ifstream in(path / "manifest.json");
      if (!in) throw InvalidArgumentError("manifest.json is missing");
      nlohmann::json manifest = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (manifest.is_discarded()) throw InvalidArgumentError("manifest.json is not valid JSON");
      const auto& f = manifest.at("files").at("tables.safetensors");
      uint64_t size = 0;
      const uint32_t crc = file_crc(path / "tables.safetensors", &size);
      if (size != json_integer<uint64_t>(f.at("bytes")) || crc != json_integer<uint32_t>(f.at("crc32")))
        throw InvalidArgumentError(fmt::format(
            "tables.safetensors has {} bytes with CRC-32 {:08x}; the manifest says {} bytes, "
            "{:08x} (corrupt or truncated)",
            size, crc, json_integer<uint64_t>(f.at("bytes")), json_integer<uint32_t>(f.at("crc32"))));
      CheckpointData data;
      data.manifest = std::move(manifest);
      data.tensors = read_safetensors_file((path / "tables.safetensors").string());
      return std::make_pair(path.string(), std::move(data));
    } catch (const std::exception& e) {
      DTRAIN_LOG_WARN("ps checkpoint: skipping {}: {}; trying an older one", path.string(),
                      e.what());
    }
  }
  return std::nullopt;
}

}  // namespace dtrain::ps
