// A server's checkpoints: DIR/ckpt-<n>/ holding tables.safetensors (every table's values,
// optimizer state and pending sums) and manifest.json (table specs, versions, clocks, the CRC-32
// and size of tables.safetensors). Written to DIR/.ckpt-<n>.tmp-<pid>, fsynced, then renamed, so a
// server killed mid-write leaves the previous checkpoint intact; the newest K are kept.
// Loading takes the newest checkpoint whose manifest and checksum hold, logging the ones skipped.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/safetensors_file.h"

namespace dtrain::ps {

struct CheckpointData {
  nlohmann::json manifest;  // {"server": i, "tables": [...]} plus what write adds
  std::vector<SafetensorsEntry> tensors;
};

// Returns the directory written. Throws the I/O error's kind (a full disk:
// ResourceExhaustedError; a failed fsync: DataLossError; common/durable.h) naming the path; a
// failed save leaves the previous checkpoints as they were.
std::string write_checkpoint(const std::string& dir, CheckpointData data, int keep);
// The newest good checkpoint in dir, with its path; nullopt when there is none.
std::optional<std::pair<std::string, CheckpointData>> read_latest_checkpoint(
    const std::string& dir);

}  // namespace dtrain::ps
