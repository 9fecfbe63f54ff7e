// Runs a program to its end for the launcher tests (mpirun, srun, sbatch, python3): stdout and
// stderr captured together, a clean environment (none of the launcher variables of whatever runs
// the test), and a deadline after which the program's whole process group is stopped.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::testing {

struct CommandResult {
  int exit_code = -1;  // valid when neither signaled nor timed out
  int signal = 0;
  bool timed_out = false;
  std::string output;  // stdout and stderr, interleaved as written
  double seconds = 0;
  bool ok() const { return !timed_out && signal == 0 && exit_code == 0; }
  // "exit 1", "signal 9", "timed out after 60 s", for failure messages.
  std::string describe() const;
};

struct CommandOptions {
  // Set (a value) or removed (nullopt) on top of this process's environment, from which every
  // variable that tells a process its rank or master (RANK, OMPI_*, SLURM_*, ...) is removed.
  std::map<std::string, std::optional<std::string>> env;
  std::chrono::milliseconds timeout{60'000};
  std::string cwd;  // "" = this process's
};

// Runs argv[0] (found through PATH when it has no slash). The child gets its own process group,
// dies with this process (PR_SET_PDEATHSIG), and at the deadline gets SIGTERM, then SIGKILL
// two seconds later, group-wide.
CommandResult run_command(const std::vector<std::string>& argv, const CommandOptions& options = {});

// The environment run_command starts from, as NAME=value strings.
std::vector<std::string> clean_environment(
    const std::map<std::string, std::optional<std::string>>& changes);

// The full path of `name` in PATH (or the usual sbin folders), or "" when it is not installed.
std::string find_program(const std::string& name);

}  // namespace dtrain::testing
