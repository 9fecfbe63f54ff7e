// Who am I: a process's place in the job, read from explicit options or from whichever launcher
// started it (dtrain run / torchrun, OpenMPI, PMI, Slurm, a Kubernetes Indexed Job, TF_CONFIG).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain {

struct Identity {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;
  // "file" when the init method is file://; then store_path names the file.
  std::string store_kind = "tcp";
  std::string store_path;
  // Which convention supplied rank and world size: "options", "torchrun", "openmpi", "pmi",
  // "slurm", "kubernetes", "tf_config" or "single" (nothing set: a world of one).
  std::string source;
};

struct IdentityOptions {
  std::optional<int> rank;
  std::optional<int> world_size;
  std::optional<int> local_rank;
  std::optional<int> local_world_size;
  std::optional<int> node_rank;
  std::optional<std::string> master_addr;
  std::optional<uint16_t> master_port;
  // "env://" (default), "tcp://host:port" or "file:///path/to/store".
  std::string init_method = "env://";
};

using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;

// Resolves the identity in this order: options; RANK/WORLD_SIZE (torchrun); OMPI_COMM_WORLD_*;
// PMI_RANK/PMI_SIZE; SLURM_*; JOB_COMPLETION_INDEX with WORLD_SIZE; TF_CONFIG.
// Contradictory or missing values throw InvalidArgumentError naming the variable, its value and
// what is needed.
Identity resolve_identity(const IdentityOptions& options = {});
// The same, reading variables through `lookup` (tests feed environments this way).
Identity resolve_identity(const IdentityOptions& options, const EnvLookup& lookup);

// Expands a Slurm host list: "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5.
std::vector<std::string> expand_slurm_nodelist(std::string_view list);

}  // namespace dtrain
