// Checkpoint files: see checkpoint_files.h.
#include "torch/checkpoint_files.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <mutex>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "common/json_integer.h"
#include "common/log.h"

namespace dtrain::checkpoint_files {

namespace fs = std::filesystem;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string hex32(uint32_t v) { return fmt::format("{:08x}", v); }

std::string step_name(int64_t step) { return fmt::format("{}{:06d}", kStepPrefix, step); }

// The manifest's own checksum: over its text without the checksum, as written (2-space indent).
std::string manifest_text(Json manifest) {
  manifest.erase("manifest_crc32");
  const uint32_t crc = durable::crc32_of(manifest.dump(2));
  manifest["manifest_crc32"] = hex32(crc);
  return manifest.dump(2) + "\n";
}

Json read_manifest(const std::string& path, const char* name) {
  const std::string manifest_path = path + "/" + name;
  std::string text;
  try {
    text = durable::read_file(manifest_path);
  } catch (const std::exception& e) {
    throw CorruptCheckpoint(fmt::format("{}: no readable manifest: {}", path, e.what()));
  }
  Json manifest = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (manifest.is_discarded() || !manifest.is_object())
    throw CorruptCheckpoint(fmt::format(
        "{}: {} is not valid JSON ({} bytes; truncated or overwritten)", path, name, text.size()));
  if (!manifest.contains("manifest_crc32") || !manifest["manifest_crc32"].is_string())
    throw CorruptCheckpoint(fmt::format("{}: {} has no manifest_crc32", path, name));
  const std::string recorded = manifest["manifest_crc32"].get<std::string>();
  Json body = manifest;
  body.erase("manifest_crc32");
  const std::string found = hex32(durable::crc32_of(body.dump(2)));
  if (found != recorded)
    throw CorruptCheckpoint(
        fmt::format("{}: {} is corrupt: CRC-32 {} expected (recorded in it), {} found", path, name,
                    recorded, found));
  return manifest;
}

void verify_listed_files(const std::string& path, const Json& manifest) {
  for (const auto& [name, entry] : manifest.at("files").items()) {
    const std::string file = path + "/" + name;
    const uint64_t bytes = json_integer<uint64_t>(entry.at("bytes"));
    const std::string crc = entry.at("crc32").get<std::string>();
    std::error_code ec;
    const uint64_t size = fs::file_size(file, ec);
    if (ec)
      throw CorruptCheckpoint(
          fmt::format("{}: {} is missing or unreadable ({}); the manifest expects "
                      "{} bytes",
                      path, name, ec.message(), bytes));
    if (size != bytes)
      throw CorruptCheckpoint(fmt::format(
          "{}: {} has {} bytes, the manifest expects {} (truncated?)", path, name, size, bytes));
    FileSum sum;
    try {
      sum = sum_file(file, /*sync=*/false);
    } catch (const std::exception& e) {
      throw CorruptCheckpoint(fmt::format("{}: {}", path, e.what()));
    }
    if (hex32(sum.crc) != crc)
      throw CorruptCheckpoint(
          fmt::format("{}: {} is corrupt: CRC-32 {} expected (manifest), {} found "
                      "over its {} bytes",
                      path, name, crc, hex32(sum.crc), sum.bytes));
  }
}

Json verify_checkpoint(const std::string& path, const char* manifest_name, const char* format,
                       int version) {
  Json manifest = read_manifest(path, manifest_name);
  try {
    if (manifest.value("format", "") != format ||
        json_integer<int>(manifest, "version", 0) != version)
      throw CorruptCheckpoint(fmt::format("{}: {} is not a {} version {} manifest", path,
                                          manifest_name, format, version));
    verify_listed_files(path, manifest);
  } catch (const nlohmann::json::exception& e) {
    throw CorruptCheckpoint(fmt::format("{}: {} lacks an entry or has one of the wrong type: {}",
                                        path, manifest_name, e.what()));
  }
  return manifest;
}

Json progress_json(const TrainingProgress& p) {
  Json values = Json::object();
  for (const auto& [k, v] : p.values) values[k] = std::isfinite(v) ? Json(v) : Json(nullptr);
  return {{"step", p.step},
          {"epoch", p.epoch},
          {"epoch_consumed", p.epoch_consumed},
          {"epoch_size", p.epoch_size},
          {"world_size", p.world_size},
          {"values", values}};
}

TrainingProgress progress_of(const Json& m) {
  TrainingProgress p;
  p.step = json_integer<int64_t>(m.at("step"));
  p.epoch = json_integer<int64_t>(m.at("epoch"));
  p.epoch_consumed = json_integer<int64_t>(m.at("epoch_consumed"));
  p.epoch_size = json_integer<int64_t>(m.at("epoch_size"));
  p.world_size = json_integer<int>(m.at("world_size"));
  for (const auto& [k, v] : m.at("values").items())
    p.values[k] = v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>();
  return p;
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

at::Tensor rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_rng_state(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace dtrain::checkpoint_files
