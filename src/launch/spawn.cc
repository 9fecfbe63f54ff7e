#include "launch/spawn.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/socket.h"  // net::Fd
#include "dtrain/error.h"

extern char** environ;

namespace dtrain::launch {
namespace {

// What the status pipe carries when the child fails before its program runs.
struct ChildFailure {
  enum Stage : int { kExec, kNetns, kCwd, kOutput, kFork } stage;
  int error;
};

// Prepared before fork: the child only reads it.
struct ChildSetup {
  const char* path;
  char* const* argv;
  char* const* envp;
  const char* cwd;          // null: stay
  const char* output_file;  // null: the descriptors below
  int stdin_fd, stdout_fd, stderr_fd, status_fd;
  pid_t parent;
  const SpawnOptions* o;
};

[[noreturn]] void fail(const ChildSetup& s, ChildFailure::Stage stage) {
  const ChildFailure failure{stage, errno};
  [[maybe_unused]] ssize_t n = ::write(s.status_fd, &failure, sizeof(failure));
  ::_exit(127);
}

// Makes `fd` the descriptor `target` and leaves it open across exec.
void move_fd(int fd, int target) {
  if (fd == target) {
    ::fcntl(fd, F_SETFD, 0);
  } else {
    ::dup2(fd, target);
  }
}

// Runs in the forked child: only async-signal-safe calls.
[[noreturn]] void exec_child(const ChildSetup& s) {
  const SpawnOptions& o = *s.o;
  if (o.detach) {
    ::setsid();
    const pid_t child = ::fork();  // the grandchild is nobody's child: no zombie
    if (child < 0) fail(s, ChildFailure::kFork);
    if (child > 0) ::_exit(0);
  } else if (o.own_process_group) {
    ::setpgid(0, 0);
  }
  if (o.die_with_parent) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != s.parent) ::_exit(127);  // the parent died before prctl took effect
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGPIPE, &dfl, nullptr);
  if (o.signal_mask != nullptr) ::sigprocmask(SIG_SETMASK, o.signal_mask, nullptr);
  if (o.cpus != nullptr) ::sched_setaffinity(0, sizeof(cpu_set_t), o.cpus);
  if (o.idle_priority) {
    const sched_param none{};
    ::sched_setscheduler(0, SCHED_IDLE, &none);
  }
  if (o.netns_fd >= 0 && ::setns(o.netns_fd, CLONE_NEWNET) != 0) fail(s, ChildFailure::kNetns);
  if (s.cwd != nullptr && ::chdir(s.cwd) != 0) fail(s, ChildFailure::kCwd);
  move_fd(s.stdin_fd, 0);
  if (s.output_file != nullptr) {
    const int out = ::open(s.output_file, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (out < 0) fail(s, ChildFailure::kOutput);
    move_fd(out, 1);
    move_fd(out, 2);
    if (out > 2) ::close(out);
  } else {
    if (s.stdout_fd >= 0) move_fd(s.stdout_fd, 1);
    if (s.stderr_fd >= 0) move_fd(s.stderr_fd, 2);
  }
  ::execve(s.path, s.argv, s.envp);
  fail(s, ChildFailure::kExec);
}

}  // namespace

std::vector<std::string> child_environment(const SpawnOptions& o) {
  std::vector<std::string> env;
  if (o.inherit_environment) {
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string_view entry(*e);
      const std::string_view name = entry.substr(0, entry.find('='));
      bool replaced = false;
      for (const auto& [key, value] : o.env) replaced = replaced || key == name;
      if (!replaced) env.emplace_back(entry);
    }
  }
  const size_t inherited = env.size();
  for (const auto& [key, value] : o.env) {
    std::string entry = key + "=" + value;
    bool replaced = false;  // a name given twice: the later value wins, as with setenv
    for (size_t i = inherited; i < env.size() && !replaced; ++i)
      if (env[i].starts_with(key + "=")) {
        env[i] = entry;
        replaced = true;
      }
    if (!replaced) env.push_back(std::move(entry));
  }
  return env;
}

namespace {

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> p;
  for (auto& s : strings) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

std::string describe(const ChildFailure& f, const SpawnOptions& o) {
  const char* why = std::strerror(f.error);
  switch (f.stage) {
    case ChildFailure::kExec:
      return fmt::format("cannot execute {}: {}", o.path, why);
    case ChildFailure::kNetns:
      return fmt::format("cannot enter its network namespace: {} (setns; root?)", why);
    case ChildFailure::kCwd:
      return fmt::format("cannot enter the directory {}: {}", o.cwd, why);
    case ChildFailure::kOutput:
      return fmt::format("cannot open its output file {}: {}", o.output_file, why);
    case ChildFailure::kFork:
      return fmt::format("cannot fork it off its own session: {}", why);
  }
  return why;
}

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

Spawned spawn(const SpawnOptions& o) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw InternalError(fmt::format("starting {}: pipe2 failed: {}", o.path, std::strerror(errno)));
  net::Fd status_r(fds[0]), status_w(fds[1]);
  net::Fd devnull;
  if (o.stdin_fd < 0) devnull = net::Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  std::vector<std::string> args = o.argv;
  std::vector<char*> argv = pointers(args);
  std::vector<std::string> env = child_environment(o);
  std::vector<char*> envp = pointers(env);
  const ChildSetup setup{o.path.c_str(),
                         argv.data(),
                         envp.data(),
                         o.cwd.empty() ? nullptr : o.cwd.c_str(),
                         o.output_file.empty() ? nullptr : o.output_file.c_str(),
                         o.stdin_fd >= 0 ? o.stdin_fd : devnull.get(),
                         o.stdout_fd,
                         o.stderr_fd,
                         status_w.get(),
                         ::getpid(),
                         &o};
  const pid_t pid = ::fork();
  if (pid < 0)
    throw InternalError(fmt::format("starting {}: fork failed: {}", o.path, std::strerror(errno)));
  if (pid == 0) exec_child(setup);
  Spawned spawned;
  if (o.detach) {
    ::waitpid(pid, nullptr, 0);  // the intermediate child, gone at once
  } else {
    // Also set the group here, so that signalling the group works before the child has run.
    if (o.own_process_group) ::setpgid(pid, pid);
    spawned.pid = pid;
  }
  status_w.reset();
  // The pipe closes at a successful exec and says what failed otherwise.
  pollfd p{status_r.get(), POLLIN, 0};
  ChildFailure failure{};
  if (::poll(&p, 1, 5000) > 0 &&
      ::read(status_r.get(), &failure, sizeof(failure)) == sizeof(failure))
    spawned.failure = describe(failure, o);
  return spawned;
}

std::string find_executable(const std::string& name) {
  if (name.empty()) throw InvalidArgumentError("dtrain run: the worker command is empty");
  if (name.find('/') != std::string::npos) {
    if (!is_executable_file(name))
      throw InvalidArgumentError(fmt::format(
          "dtrain run: cannot run '{}': {}", name,
          ::access(name.c_str(), F_OK) == 0 ? "it is not an executable file" : "no such file"));
    return name;
  }
  const char* path_env = std::getenv("PATH");
  // execvp's default search path when PATH is unset.
  std::string path = path_env != nullptr ? path_env : "/bin:/usr/bin";
  size_t start = 0;
  for (;;) {
    size_t colon = path.find(':', start);
    std::string dir =
        path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (is_executable_file(candidate)) return candidate;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  throw InvalidArgumentError(fmt::format(
      "dtrain run: command '{}' was not found on PATH ({}): check its name, or give its path", name,
      path));
}

}  // namespace dtrain::launch
