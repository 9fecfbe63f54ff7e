// Runs a function in N forked processes (one per rank) and collects how each ended, with a
// deadline after which every child still running is killed. The Gloo multiproc_test idea:
// real processes, so a test can SIGKILL one and watch the others fail.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "support/crash_report.h"

namespace dtrain::testing {

struct ChildResult {
  int exit_code = -1;  // valid when !signaled
  int signal = 0;
  bool timed_out = false;
  bool ok() const { return !timed_out && signal == 0 && exit_code == 0; }
};

// Forks one child per rank; each runs fn(rank) and exits 0, or prints the exception and exits 1.
// fn may also call _exit itself (e.g. 3 to say "failed as expected"). Children still alive at
// the deadline are SIGKILLed and reported as timed out.
inline std::vector<ChildResult> run_ranks(int n, const std::function<void(int)>& fn,
                                          std::chrono::milliseconds deadline =
                                              std::chrono::seconds(60)) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids(n, -1);
  for (int r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      report_crashes(r);
      int code = 0;
      try {
        fn(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] exception: %s\n", r, e.what());
        code = 1;
      } catch (...) {
        std::fprintf(stderr, "[rank %d] unknown exception\n", r);
        code = 1;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    pids[r] = pid;
  }
  std::vector<ChildResult> results(n);
  std::vector<bool> done(n, false);
  auto end = std::chrono::steady_clock::now() + deadline;
  int remaining = n;
  while (remaining > 0) {
    for (int r = 0; r < n; ++r) {
      if (done[r]) continue;
      int status = 0;
      pid_t got = ::waitpid(pids[r], &status, WNOHANG);
      if (got == pids[r]) {
        done[r] = true;
        --remaining;
        if (WIFEXITED(status)) results[r].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) results[r].signal = WTERMSIG(status);
      }
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() > end) {
      for (int r = 0; r < n; ++r) {
        if (done[r]) continue;
        ::kill(pids[r], SIGKILL);
        ::waitpid(pids[r], nullptr, 0);
        results[r].timed_out = true;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return results;
}

// A free TCP port on loopback (bound then released; fine for tests on one machine).
int free_port();

}  // namespace dtrain::testing
