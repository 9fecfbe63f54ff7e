// Checkpoint files: see checkpoint_files.h.
#include "torch/checkpoint_files.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <mutex>

#include "common/json_integer.h"
#include "common/log.h"
#include "common/socket.h"

namespace dtrain::checkpoint_files {

namespace fs = std::filesystem;
using net::Fd;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string errno_text(int err) { return fmt::format("{} ({})", std::strerror(err), err); }

std::string hex32(uint32_t v) { return fmt::format("{:08x}", v); }

uint32_t crc_of(const std::string& text) {
  return static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(text.data()), static_cast<uInt>(text.size())));
}

FileSum sum_file(const std::string& path, bool sync) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid())
    throw InvalidArgumentError(fmt::format("cannot open {}: {}", path, errno_text(errno)));
  std::vector<unsigned char> buf(size_t{1} << 20);
  FileSum sum;
  uLong crc = crc32(0, nullptr, 0);
  for (;;) {
    ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw InvalidArgumentError(fmt::format("reading {} failed: {}", path, errno_text(errno)));
    if (n == 0) break;
    crc = crc32(crc, buf.data(), static_cast<uInt>(n));
    sum.bytes += static_cast<uint64_t>(n);
  }
  if (sync && ::fsync(fd.get()) != 0)
    throw InvalidArgumentError(fmt::format("fsync of {} failed: {}", path, errno_text(errno)));
  sum.crc = static_cast<uint32_t>(crc);
  return sum;
}

void write_durable(const std::string& path, const std::string& text) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid())
    throw InvalidArgumentError(fmt::format("cannot create {}: {}", path, errno_text(errno)));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw InvalidArgumentError(fmt::format("writing {} failed: {}", path, errno_text(errno)));
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0)
    throw InvalidArgumentError(fmt::format("fsync of {} failed: {}", path, errno_text(errno)));
}

void fsync_dir(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid() || ::fsync(fd.get()) != 0)
    throw InvalidArgumentError(
        fmt::format("fsync of directory {} failed: {}", dir, errno_text(errno)));
}

std::string read_text(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid())
    throw InvalidArgumentError(fmt::format("cannot open {}: {}", path, errno_text(errno)));
  std::string text;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw InvalidArgumentError(fmt::format("reading {} failed: {}", path, errno_text(errno)));
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

std::string step_name(int64_t step) { return fmt::format("step-{:06d}", step); }

// Steps of DIR's checkpoints (directories named step-<digits>), newest first.
std::vector<int64_t> list_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= 5 || name.compare(0, 5, "step-") != 0) continue;
    if (!std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    if (name.size() > 5 + 18) continue;
    if (e.is_directory(ec)) steps.push_back(std::stoll(name.substr(5)));
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

// Temporary directories of saves that never finished (their writer was killed), and directories
// set aside while replacing a checkpoint of the same step. Not ours: ours may be in progress.
void remove_stale_temporaries(const std::string& dir) {
  const std::string mine = fmt::format("-{}", ::getpid());
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".step-", 0) != 0) continue;
    const bool temp =
        name.find(".tmp-") != std::string::npos || name.find(".old-") != std::string::npos;
    const bool ours = name.size() >= mine.size() &&
                      name.compare(name.size() - mine.size(), mine.size(), mine) == 0;
    if (!temp || ours) continue;
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (rm) {
      DTRAIN_LOG_WARN("checkpoint: cannot remove the unfinished save {}: {}", e.path().string(),
                      rm.message());
    } else {
      DTRAIN_LOG_INFO("checkpoint: removed {}, left by a save that did not finish",
                      e.path().string());
    }
  }
}

// Puts `tmp` in place as `final`. A checkpoint of the same step may exist (a resumed run saving
// a step again): the two are swapped atomically and the old one removed.
void install(const std::string& tmp, const std::string& final_path, const std::string& dir) {
  if (::rename(tmp.c_str(), final_path.c_str()) == 0) return;
  const int err = errno;
  if (err != ENOTEMPTY && err != EEXIST)
    throw InvalidArgumentError(
        fmt::format("renaming {} to {} failed: {}", tmp, final_path, errno_text(err)));
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) != 0) {
    // A filesystem without RENAME_EXCHANGE: set the old one aside first (names starting with a
    // dot are never taken for checkpoints, and a later writer removes them).
    const std::string aside =
        fmt::format("{}/.{}.old-{}", dir, fs::path(final_path).filename().string(), ::getpid());
    if (::rename(final_path.c_str(), aside.c_str()) != 0 ||
        ::rename(tmp.c_str(), final_path.c_str()) != 0)
      throw InvalidArgumentError(
          fmt::format("replacing {} failed: {}", final_path, errno_text(errno)));
    fs::remove_all(aside);
    return;
  }
  fs::remove_all(tmp);  // now the old checkpoint
}

// After writing step `written`: checkpoints of later steps belong to a history training has
// abandoned (it resumed from an earlier state) and go; of the rest the newest `keep` stay, the one
// just written always among them.
void prune(const std::string& dir, int keep, int64_t written) {
  int kept = 0;
  for (int64_t step : list_steps(dir)) {
    if (step <= written && kept < std::max(keep, 1)) {
      ++kept;
      continue;
    }
    std::error_code ec;
    fs::remove_all(checkpoint_path(dir, step), ec);
    if (ec)
      DTRAIN_LOG_WARN("checkpoint: cannot remove the old checkpoint {}: {}",
                      checkpoint_path(dir, step), ec.message());
  }
}

// The manifest's own checksum: over its text without the checksum, as written (2-space indent).
std::string manifest_text(Json manifest) {
  manifest.erase("manifest_crc32");
  const uint32_t crc = crc_of(manifest.dump(2));
  manifest["manifest_crc32"] = hex32(crc);
  return manifest.dump(2) + "\n";
}

Json read_manifest(const std::string& path, const char* name) {
  const std::string manifest_path = path + "/" + name;
  std::string text;
  try {
    text = read_text(manifest_path);
  } catch (const std::exception& e) {
    throw CorruptCheckpoint(fmt::format("{}: no readable manifest: {}", path, e.what()));
  }
  Json manifest = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (manifest.is_discarded() || !manifest.is_object())
    throw CorruptCheckpoint(
        fmt::format("{}: {} is not valid JSON ({} bytes; truncated or overwritten)", path,
                    name, text.size()));
  if (!manifest.contains("manifest_crc32") || !manifest["manifest_crc32"].is_string())
    throw CorruptCheckpoint(fmt::format("{}: {} has no manifest_crc32", path, name));
  const std::string recorded = manifest["manifest_crc32"].get<std::string>();
  Json body = manifest;
  body.erase("manifest_crc32");
  const std::string found = hex32(crc_of(body.dump(2)));
  if (found != recorded)
    throw CorruptCheckpoint(
        fmt::format("{}: {} is corrupt: CRC-32 {} expected (recorded in it), {} found", path,
                    name, recorded, found));
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
