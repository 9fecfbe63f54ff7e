#include "launch/submit/memory_probe.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "launch/spawn.h"

namespace dtrain::submit {
namespace fs = std::filesystem;

std::string MemoryProbe::describe() const {
  return fmt::format("a {:.1f} s probe run peaked at {:.0f} MiB in its largest rank; asking {}",
                     seconds, peak_rank_bytes / (1 << 20), memory);
}

MemoryProbe probe_memory(const Job& job, std::chrono::seconds limit) {
  const char* tmp = std::getenv("TMPDIR");
  std::string scratch =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/dtrain-probe-XXXXXX";
  if (::mkdtemp(scratch.data()) == nullptr)
    throw InvalidArgumentError(
        fmt::format("dtrain submit --mem auto: cannot make {}: {}", scratch, std::strerror(errno)));
  std::error_code ec;
  const std::string exe = fs::read_symlink("/proc/self/exe", ec).string();
  std::vector<std::string> args = {ec ? "dtrain" : exe, "run", "-n",
                                   std::to_string(job.procs_per_node), "--"};
  args.insert(args.end(), job.command.begin(), job.command.end());
  const std::string log = scratch + "/probe.log";
  const auto start = std::chrono::steady_clock::now();
  // In this directory, so that the command and its relative paths mean what they will in the
  // job; its temporary files go to the scratch directory.
  launch::SpawnOptions o{.path = launch::find_executable(args[0]),
                         .argv = args,
                         .env = {{"TMPDIR", scratch}},
                         .output_file = log};
  for (const auto& [k, v] : job.env) o.env.emplace_back(k, v);
  const launch::Spawned spawned = launch::spawn(o);
  if (!spawned.failure.empty())
    throw InvalidArgumentError("dtrain submit --mem auto: cannot run the probe: " +
                               spawned.failure);
  const pid_t pid = spawned.pid;
  int status = 0;
  bool stopped = false;
  for (;;) {
    if (::waitpid(pid, &status, WNOHANG) == pid) break;
    const auto ran = std::chrono::steady_clock::now() - start;
    if (!stopped && ran >= limit) {
      ::kill(-pid, SIGTERM);  // enough seen: dtrain run stops its ranks
      stopped = true;
    } else if (stopped && ran >= limit + std::chrono::seconds(15)) {
      ::kill(-pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  MemoryProbe p;
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::ifstream in(log);
  const std::string output(std::istreambuf_iterator<char>(in), {});
  fs::remove_all(scratch, ec);
  if (WIFSIGNALED(status))
    throw InvalidArgumentError(fmt::format(
        "dtrain submit --mem auto: the probe run {} after {:.1f} s, so the memory its ranks "
        "reached is unknown; give --mem instead",
        stopped ? "did not stop within 15 s of SIGTERM and was killed"
                : fmt::format("was ended by signal {}", WTERMSIG(status)),
        p.seconds));
  const bool failed = !stopped && !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (failed)
    throw InvalidArgumentError(fmt::format(
        "dtrain submit --mem auto: the probe run of the command failed ({}) after {:.1f} s, so "
        "its memory is unknown; give --mem instead. Its output ends:\n{}",
        WIFEXITED(status) ? fmt::format("exit {}", WEXITSTATUS(status))
                          : fmt::format("signal {}", WTERMSIG(status)),
        p.seconds, output.size() > 2000 ? output.substr(output.size() - 2000) : output));
  rusage usage{};
  ::getrusage(RUSAGE_CHILDREN, &usage);
  p.peak_rank_bytes = static_cast<double>(usage.ru_maxrss) * 1024;  // Linux: KiB
  const double node = p.peak_rank_bytes * job.procs_per_node * 1.25;
  p.memory = fmt::format("{}M", static_cast<long long>(std::ceil(node / (1 << 20))));
  return p;
}

}  // namespace dtrain::submit
