// The files of checkpoints, shared by the whole-model checkpoints (checkpoint.cc) and the
// sharded ones (sharded_checkpoint.cc): step directories (step-<n>) on the durable layer
// (common/durable.h: writes, fsyncs, checksums, installs, pruning), manifests that carry their
// own CRC-32, LibTorch's generator. Internal to dtrain_torch.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "common/durable.h"
#include "dtrain/error.h"
#include "dtrain/torch/checkpoint.h"

namespace dtrain::checkpoint_files {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// A checkpoint that fails verification (its bytes are not what was written): skipped at load in
// favour of an older one.
class CorruptCheckpoint : public DataLossError {
 public:
  explicit CorruptCheckpoint(const std::string& m) : DataLossError(m) {}
};

double ms_since(Clock::time_point start);
std::string hex32(uint32_t v);

using durable::FileSum;
using durable::fsync_dir;
using durable::install;
using durable::sum_file;

inline constexpr const char* kStepPrefix = "step-";
std::string step_name(int64_t step);  // "step-000120"
// Steps of DIR's checkpoints (directories named step-<digits>), newest first.
inline std::vector<int64_t> list_steps(const std::string& dir) {
  return durable::list_numbered(dir, kStepPrefix);
}
// Temporary directories of saves that never finished (their writer was killed), and directories
// set aside while replacing a checkpoint of the same step. Not this process's.
inline void remove_stale_temporaries(const std::string& dir) {
  durable::remove_temporaries(dir, kStepPrefix);
}
// After writing step `written`: checkpoints of later steps belong to a history training has
// abandoned (it resumed from an earlier state) and go; of the rest the newest `keep` stay.
inline void prune(const std::string& dir, int keep, int64_t written) {
  durable::prune(dir, kStepPrefix, keep, written);
}

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

// A manifest's progress fields (step, epoch, epoch_consumed, epoch_size, world_size, values; a
// value that is not finite as null), and back.
Json progress_json(const TrainingProgress& p);
TrainingProgress progress_of(const Json& m);
std::string utc_now();
std::string hostname();

at::Tensor rng_state();  // LibTorch's default CPU generator
void set_rng_state(const at::Tensor& state);

}  // namespace dtrain::checkpoint_files
