// The files of checkpoints, shared by the whole-model checkpoints (checkpoint.cc) and the
// sharded ones (sharded_checkpoint.cc): durable writes, checksums, manifests that carry their own
// CRC-32, step directories, atomic installs, pruning, LibTorch's generator. Internal to
// dtrain_torch.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "dtrain/error.h"
#include "dtrain/torch/checkpoint.h"

namespace dtrain::checkpoint_files {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// A checkpoint that fails verification: skipped at load in favour of an older one.
class CorruptCheckpoint : public InvalidArgumentError {
 public:
  explicit CorruptCheckpoint(const std::string& m) : InvalidArgumentError(m) {}
};

double ms_since(Clock::time_point start);
std::string errno_text(int err);
std::string hex32(uint32_t v);
uint32_t crc_of(const std::string& text);

struct FileSum {
  uint64_t bytes = 0;
  uint32_t crc = 0;
};
// Size and CRC-32 of what is on disk; with `sync`, also makes it durable (fsync works on a
// read-only descriptor). Reading back checksums the bytes the file really holds.
FileSum sum_file(const std::string& path, bool sync);
void write_durable(const std::string& path, const std::string& text);
// A rename is durable once the directory holding the name is.
void fsync_dir(const std::string& dir);
std::string read_text(const std::string& path);

std::string step_name(int64_t step);  // "step-000120"
// Steps of DIR's checkpoints (directories named step-<digits>), newest first.
std::vector<int64_t> list_steps(const std::string& dir);
// Temporary directories of saves that never finished (their writer was killed), and directories
// set aside while replacing a checkpoint of the same step. Not this process's.
void remove_stale_temporaries(const std::string& dir);
// Puts `tmp` in place as `final_path` (swapping out a checkpoint of the same step).
void install(const std::string& tmp, const std::string& final_path, const std::string& dir);
// After writing step `written`: later steps go, and of the rest the newest `keep` stay.
void prune(const std::string& dir, int keep, int64_t written);

// The manifest's text with its own checksum (over its text without it, 2-space indent).
std::string manifest_text(Json manifest);
// Reads DIR's `name` manifest and checks its checksum; throws CorruptCheckpoint saying why not.
Json read_manifest(const std::string& path, const char* name);
// Every file the manifest's "files" lists has the recorded size and CRC-32; throws
// CorruptCheckpoint naming the file, what was expected and what was found.
void verify_listed_files(const std::string& path, const Json& manifest);
// read_manifest, its format and version, then verify_listed_files: the manifest of a complete
// checkpoint, or CorruptCheckpoint saying what is wrong.
Json verify_checkpoint(const std::string& path, const char* manifest_name, const char* format,
                       int version);

TrainingProgress progress_of(const Json& m);
std::string utc_now();
std::string hostname();

at::Tensor rng_state();  // LibTorch's default CPU generator
void set_rng_state(const at::Tensor& state);

}  // namespace dtrain::checkpoint_files
