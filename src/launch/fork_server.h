// Python workers forked from one process that imported their heavy modules once (`dtrain run
// --preload torch`), instead of each starting an interpreter that imports them again: a spare or
// a replacement started while the others train then takes milliseconds of a core where importing
// torch takes seconds of the cores the ranks train on. The server is
// python/dtrain/_fork_server.py; this is the launcher's side.
//
// A worker it forks is this process's own child (the server forks twice and this process is a
// subreaper while the server lives), so the caller reaps it, reads its exit status and signals
// its process group like any worker it spawned. Orphans of the workers' own children come to this
// process too: the caller reaps children it did not start (reap_strays()), and must not start
// children of its own that some other thread waits for while a server lives.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "common/socket.h"  // net::Fd
#include "launch/spawn.h"

namespace dtrain::launch {

struct ForkServerOptions {
  std::string python;                // the workers' interpreter (a path)
  std::vector<std::string> modules;  // imported once, before the first fork
  // The server's environment over this process's (the modules read it as they load).
  std::vector<std::pair<std::string, std::string>> env;
  int stderr_fd = 2;                      // its own output: an import's traceback
  const sigset_t* signal_mask = nullptr;  // its blocked signals, which the workers inherit
  // How long a fork may take to be answered before the server counts as failed.
  std::chrono::milliseconds answer_timeout{10000};
};

class ForkServer {
 public:
  enum class State { kStarting, kReady, kFailed };

  // Starts the server and returns; it imports the modules meanwhile. Throws InternalError when
  // this process cannot make the socket or fork.
  explicit ForkServer(const ForkServerOptions& options);
  // Closes the server's socket (it exits), SIGKILLs it should it linger, and stops being a
  // subreaper.
  ~ForkServer();
  ForkServer(const ForkServer&) = delete;
  ForkServer& operator=(const ForkServer&) = delete;

  State state() const { return state_; }
  // Why it failed (kFailed): "importing torch failed: ModuleNotFoundError: ...".
  const std::string& failure() const { return failure_; }
  pid_t pid() const { return pid_; }
  // Readable while kStarting once the server has its word (ready, or why not): then call
  // take_word().
  int fd() const { return socket_.get(); }
  void take_word();

  // Forks a worker as `o` says (argv, environment, directory, the three descriptors, CPUs, idle
  // priority; not a network namespace nor an output file). Needs kReady. When the server does
  // not answer within the timeout or cannot fork, the result says why and the server is failed.
  Spawned spawn(const SpawnOptions& o);

  // Reaps the children of this process that have exited and are neither the server nor one of
  // `known` (its workers, which the caller reaps itself); the server's own exit fails it.
  void reap_strays(const std::vector<pid_t>& known);

  // "" when `command` can be forked from a server: PYTHON [-u] SCRIPT ARGS... or PYTHON [-u] -m
  // MODULE ARGS...; else why not.
  static std::string why_not_forkable(const std::vector<std::string>& command);

 private:
  void fail(std::string why);

  ForkServerOptions options_;
  net::Fd socket_;
  pid_t pid_ = -1;
  State state_ = State::kStarting;
  std::string failure_;
  int was_subreaper_ = 0;
};

}  // namespace dtrain::launch
