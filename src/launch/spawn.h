// Starting a program as a child process: the one fork and exec behind the launcher's workers
// (launch/supervisor.h), the local queue's runner and jobs, and `dtrain submit --mem auto`'s
// probe (launch/submit/). Everything the child needs is made before fork, since the parent may
// have threads: after fork the child makes only async-signal-safe calls. When the program cannot
// start, the child tells the parent why through a pipe that a successful exec closes, and exits
// with 127, as a shell does.
#pragma once

#include <sched.h>
#include <signal.h>
#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace dtrain::launch {

struct SpawnOptions {
  std::string path;               // the program; find_executable() resolves a bare name
  std::vector<std::string> argv;  // argv[0] included
  // The child's environment: this process's with `env` set over it, or only `env` (a name given
  // twice there: the later value).
  std::vector<std::pair<std::string, std::string>> env;
  bool inherit_environment = true;
  std::string cwd;  // "": this process's
  // The child's standard streams: descriptors of this process (-1: /dev/null for stdin, this
  // process's own for stdout and stderr), or both outputs appended to `output_file`.
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  std::string output_file;
  bool own_process_group = true;  // setpgid(0, 0): signalling -pid reaches what it starts
  bool die_with_parent = false;   // SIGKILL when this process dies (PR_SET_PDEATHSIG)
  // Its own session, and the child of nobody here (it is started by a child that exits at once):
  // nothing to reap; Spawned::pid is then -1.
  bool detach = false;
  const sigset_t* signal_mask = nullptr;  // the child's blocked signals; null: this thread's
  const cpu_set_t* cpus = nullptr;        // the CPUs it may run on; null: this process's
  bool idle_priority = false;             // SCHED_IDLE (launch/idle_priority.h)
  int netns_fd = -1;                      // a network namespace to enter first (setns)
};

struct Spawned {
  pid_t pid = -1;
  // Why the program did not start ("cannot execute /usr/bin/x: Permission denied"); "" when it
  // did. The child, when there is one, has then exited with 127 and is still to be reaped.
  std::string failure;
};

// Throws InternalError when this process cannot fork or make the pipe.
Spawned spawn(const SpawnOptions& options);

// The environment spawn() gives the child, as NAME=VALUE entries.
std::vector<std::string> child_environment(const SpawnOptions& options);

// The file execvp would run for `name`: `name` itself when it holds a '/', else the first
// executable regular file of that name on PATH. Throws InvalidArgumentError saying what was
// searched when there is none.
std::string find_executable(const std::string& name);

}  // namespace dtrain::launch
