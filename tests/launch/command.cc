#include "command.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

extern char** environ;

namespace dtrain::testing {
namespace {

using Clock = std::chrono::steady_clock;

// What a launcher sets to tell a process its place: a test must not inherit them from whatever
// runs it (a CI job inside a Slurm allocation, a shell under mpirun).
bool is_launcher_variable(std::string_view name) {
  for (std::string_view exact :
       {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
        "MASTER_ADDR", "MASTER_PORT", "JOB_COMPLETION_INDEX", "TF_CONFIG", "DTRAIN_AGENT_STORE",
        "DTRAIN_BACKEND", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"})
    if (name == exact) return true;
  for (std::string_view prefix : {"OMPI_COMM_WORLD_", "PMIX_", "SLURM_"})
    if (name.starts_with(prefix)) return true;
  return false;
}

}  // namespace

std::string CommandResult::describe() const {
  if (timed_out) return fmt::format("timed out after {:.1f} s", seconds);
  if (signal != 0) return fmt::format("killed by signal {} after {:.1f} s", signal, seconds);
  return fmt::format("exit {} after {:.1f} s", exit_code, seconds);
}

std::vector<std::string> clean_environment(
    const std::map<std::string, std::optional<std::string>>& changes) {
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    size_t eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    std::string name(entry.substr(0, eq));
    if (!is_launcher_variable(name)) vars[name] = std::string(entry.substr(eq + 1));
  }
  for (const auto& [name, value] : changes) {
    if (value)
      vars[name] = *value;
    else
      vars.erase(name);
  }
  std::vector<std::string> out;
  for (const auto& [name, value] : vars) out.push_back(name + "=" + value);
  return out;
}

std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::string dirs = std::string(path ? path : "") + ":/usr/local/sbin:/usr/sbin:/sbin:/usr/bin";
  std::stringstream in(dirs);
  for (std::string dir; std::getline(in, dir, ':');) {
    if (dir.empty()) continue;
    std::string full = dir + "/" + name;
    struct stat st {};
    if (::stat(full.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(full.c_str(), X_OK) == 0)
      return full;
  }
  return "";
}

CommandResult run_command(const std::vector<std::string>& argv, const CommandOptions& options) {
  CommandResult result;
  const auto start = Clock::now();
  const std::string program = find_program(argv.at(0));
  if (program.empty()) {
    result.exit_code = 127;
    result.output = fmt::format("{}: not found in PATH", argv[0]);
    return result;
  }
  std::vector<std::string> env = clean_environment(options.env);
  std::vector<char*> argp, envp;
  std::vector<std::string> args = argv;
  for (auto& a : args) argp.push_back(a.data());
  argp.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    result.output = fmt::format("pipe2: {}", std::strerror(errno));
    return result;
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);  // the test died between fork and prctl
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    if (!options.cwd.empty() && ::chdir(options.cwd.c_str()) != 0) ::_exit(126);
    ::execve(program.c_str(), argp.data(), envp.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::setpgid(pid, pid);  // also here, so that the group exists before any kill below

  const auto deadline = start + options.timeout;
  std::optional<Clock::time_point> killed_at;
  bool open = true;
  int status = 0;
  bool exited = false;
  while (open || !exited) {
    if (!exited && ::waitpid(pid, &status, WNOHANG) == pid) exited = true;
    const auto now = Clock::now();
    if (now >= deadline && !killed_at) {
      // After the program's own exit, only what it left behind holding the pipe is stopped.
      result.timed_out = !exited;
      ::kill(-pid, SIGTERM);
      killed_at = now;
    }
    if (killed_at && now >= *killed_at + std::chrono::seconds(2)) {
      ::kill(-pid, SIGKILL);
      if (!exited) {
        ::waitpid(pid, &status, 0);
        exited = true;
      }
      break;  // a grandchild may hold the pipe open; stop reading
    }
    if (open) {
      pollfd p{out[0], POLLIN, 0};
      if (::poll(&p, 1, 20) > 0) {
        char buf[8192];
        ssize_t n = ::read(out[0], buf, sizeof(buf));
        if (n > 0) {
          result.output.append(buf, static_cast<size_t>(n));
        } else if (n == 0 || errno != EINTR) {
          open = false;
        }
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  ::close(out[0]);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace dtrain::testing
