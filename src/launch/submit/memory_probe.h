// `dtrain submit --mem auto`: the memory a node of the job needs, measured rather than guessed.
// The command runs here (this machine, this directory, not in the job's container) for a short
// while under `dtrain run` with the job's ranks per node, and the peak resident memory of its
// largest rank (getrusage of the waited processes) times the ranks per node, with a quarter more
// for headroom, is what is asked for.
#pragma once

#include <chrono>
#include <string>

#include "launch/submit/job.h"

namespace dtrain::submit {

struct MemoryProbe {
  double peak_rank_bytes = 0;  // the largest rank's peak resident memory
  double seconds = 0;          // how long the probe ran
  std::string memory;          // per node, in Slurm's syntax ("1536M")
  std::string describe() const;
};

// Runs the probe for at most `limit` (then SIGTERM); throws InvalidArgumentError with the end of
// its output when the command fails on its own.
MemoryProbe probe_memory(const Job& job, std::chrono::seconds limit);

}  // namespace dtrain::submit
