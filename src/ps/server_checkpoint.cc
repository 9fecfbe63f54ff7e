#include "ps/server_checkpoint.h"

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "common/durable.h"
#include "common/json_integer.h"
#include "common/log.h"
#include "dtrain/error.h"

namespace dtrain::ps {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "ckpt-";

}  // namespace

std::string write_checkpoint(const std::string& dir, CheckpointData data, int keep) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) durable::throw_io(ec.value(), "checkpoint: creating", dir);
  durable::remove_temporaries(dir, kPrefix);
  const auto existing = durable::list_numbered(dir, kPrefix);
  const int64_t n = existing.empty() ? 1 : existing.front() + 1;
  const std::string tmp = durable::temporary_path(dir, kPrefix, n);
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) durable::throw_io(ec.value(), "checkpoint: creating", tmp);
  try {
    const std::string tensors = tmp + "/tables.safetensors";
    write_safetensors_file(tensors, data.tensors);
    // Read back: the checksum is of what the disk holds.
    const auto sum = durable::sum_file(tensors, /*sync=*/true);
    data.manifest["files"] = {{"tables.safetensors", {{"crc32", sum.crc}, {"bytes", sum.bytes}}}};
    durable::write_file(tmp + "/manifest.json", data.manifest.dump(2) + "\n");
    const std::string final_path = durable::numbered_path(dir, kPrefix, n);
    durable::install(tmp, final_path, dir);
    durable::prune(dir, kPrefix, keep, n);
    return final_path;
  } catch (const std::exception&) {
    fs::remove_all(tmp, ec);  // nothing half-written stays behind
    rethrow_with_context(std::current_exception(), fmt::format("ps checkpoint {} in {}", n, dir));
  }
}

std::optional<std::pair<std::string, CheckpointData>> read_latest_checkpoint(
    const std::string& dir_text) {
  const fs::path dir(dir_text);
  durable::remove_temporaries(dir_text, kPrefix);  // saves that never finished
  for (int64_t n : durable::list_numbered(dir_text, kPrefix)) {
    const fs::path path = durable::numbered_path(dir_text, kPrefix, n);
    try {
      std::ifstream in(path / "manifest.json");
      if (!in) throw InvalidArgumentError("manifest.json is missing");
      nlohmann::json manifest = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (manifest.is_discarded()) throw InvalidArgumentError("manifest.json is not valid JSON");
      const auto& f = manifest.at("files").at("tables.safetensors");
      const auto sum = durable::sum_file((path / "tables.safetensors").string(), /*sync=*/false);
      if (sum.bytes != json_integer<uint64_t>(f.at("bytes")) ||
          sum.crc != json_integer<uint32_t>(f.at("crc32")))
        throw DataLossError(fmt::format(
            "tables.safetensors has {} bytes with CRC-32 {:08x}; the manifest says {} bytes, "
            "{:08x} (corrupt or truncated)",
            sum.bytes, sum.crc, json_integer<uint64_t>(f.at("bytes")),
            json_integer<uint32_t>(f.at("crc32"))));
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
