// The process supervisor behind `dtrain run`: starts the workers, relays their output line by line
// with a "[rank N] " prefix, forwards SIGINT/SIGTERM/SIGHUP/SIGUSR1/SIGUSR2 to them, and when one
// fails stops the rest (SIGTERM, then SIGKILL after a grace period) and reports the first failure
// in one line.
//
// One thread does it all with one poll(2) over a signalfd (SIGCHLD and the forwarded signals),
// the workers' pipes and, for the elastic agent, a stop descriptor. Each worker runs in its own
// process group, so that a signal reaches the shells and the programs they start alike, and dies
// with the launcher (PR_SET_PDEATHSIG).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/socket.h"
#include "launch/spawn.h"  // find_executable

namespace dtrain::launch {

struct WorkerSpec {
  int rank = 0;  // shown in the output prefix and the failure summary
  // Set on top of the launcher's own environment (replacing variables of the same name).
  std::vector<std::pair<std::string, std::string>> env;
  // Another command than SupervisorOptions::command (a parameter server beside the workers).
  std::vector<std::string> command;
  // How output and summaries name the process; empty = "rank <rank>".
  std::string label;
  // The CPUs it may run on (sched_setaffinity before exec); empty = the launcher's.
  std::vector<int> cpus;
  // The network namespace it runs in (/run/netns/NAME, entered before exec; needs root): a host
  // of an emulated cluster (scripts/netns-hosts.sh). Empty = the launcher's.
  std::string netns;
  // A service beside the workers (a parameter server). Once every other process has exited
  // successfully, the services still running get the grace period to end on their own, then
  // SIGTERM (and SIGKILL after another grace period); that stop is not a failure, and the job
  // ends with the workers' status.
  bool service = false;
};

// How a worker ended.
struct WorkerExit {
  int rank = 0;
  pid_t pid = -1;
  int exit_code = 0;  // when it exited
  int signal = 0;     // when a signal ended it
  std::vector<std::string> stderr_tail;
  // Set when this worker had not exited but another's post-mortem named it as the silent one
  // (stopped or stuck): the label of the worker that named it ("rank 1").
  std::string silent_per;
  // "was killed by SIGKILL (Killed)", "failed with exit code 7", or "did not answer its peers
  // (...)" for a silent one.
  std::string how() const;
};

struct SupervisorOptions {
  std::vector<std::string> command;  // argv; command[0] is looked up on PATH unless it has a '/'
  std::vector<WorkerSpec> workers;
  std::string name = "dtrain run";               // how its messages name the launcher
  bool prefix_output = true;                     // "[rank N] " before every line
  std::chrono::milliseconds grace_period{3000};  // between SIGTERM and SIGKILL
  size_t stderr_tail_lines = 20;                 // of the failing worker, in the summary
  // Where the workers write their failure records (comm/failure_record.h: DTRAIN_FLIGHT_DIR),
  // read to tell a failure's cause from its consequences; "" reads their stderr only.
  std::string failure_records;
  int stdout_fd = 1;  // where the workers' stdout lines go
  int stderr_fd = 2;  // their stderr lines, and the summary

  // When one of these is readable, every worker is stopped (SIGTERM, SIGKILL after the grace
  // period) and the result says kStopped: the hang monitor found the job stuck, or (for the
  // elastic agent, which decides about failures across machines) a worker on another machine
  // failed.
  std::vector<int> stop_fds;
  // Called once, with the first worker that fails (before the others are stopped), so that the
  // agent can tell the other machines at once.
  std::function<void(const WorkerExit&)> on_failure;
  // Called with every line a worker writes (without the prefix), stdout and stderr alike.
  std::function<void(int rank, std::string_view line)> on_line;
  // Called with every line a worker writes to stdout: a line it returns true for is the
  // caller's, not relayed (`dtrain bench` takes its ranks' results this way).
  std::function<bool(int rank, std::string_view line)> take_stdout_line;
  bool report_failure = true;  // write the one-line failure summary at the end
  // Live recovery (`dtrain run --live`): a worker that fails is reported in a line and left out;
  // the others go on (they re-form their group without it: dtrain/live_world.h). The job fails
  // only when no worker ends well.
  bool keep_survivors = false;
  // With keep_survivors: a worker that fails is started again in its place (its WorkerSpec, with
  // replacement_env on top), up to this many times in all; its peers take it in at a step
  // boundary (dtrain/live_world.h).
  int replacements = 0;
  std::vector<std::pair<std::string, std::string>> replacement_env;
  // With keep_survivors: this many workers started ahead of any failure ("spare N": the first
  // worker's WorkerSpec with replacement_env and DTRAIN_LIVE_SPARE=N on top). A worker that fails
  // gets a waiting spare in its place at once (place_spare tells the spare the dead one's
  // WorkerSpec) instead of a process started only then; each spare taken is followed by a new
  // one while `replacements` allows (it counts as one). Spares still waiting when the workers
  // are done are stopped as services are, and none of their ends fails the job. They wait at
  // the idle CPU priority where this launcher can raise them again (launch/idle_priority.h).
  int spares = 0;
  std::function<void(int spare, const WorkerSpec& place)> place_spare;
  // With spares or replacements of a Python command: modules a fork server imports once
  // (launch/fork_server.h), from which every spare and replacement is then forked instead of
  // started afresh. Spares are started once it is ready; should it fail, they and replacements
  // start the usual way, and a line says why.
  std::vector<std::string> preload;
  // With replacements, on several nodes: whether workers elsewhere can take a replacement in
  // (`dtrain run`: the job's store answers), so that one is started even when this node has
  // none left running.
  std::function<bool()> members_elsewhere;
  // Called with every worker as it exits (successfully or not), before any other is stopped for
  // it: `dtrain run` leaves the word for the worker's peers (see cmd_run.cc).
  std::function<void(const WorkerExit&)> on_exit;
  // SIGUSR2 to the launcher asks for the workers' flight records: this is called (it signals
  // the recording processes themselves), else SIGUSR2 goes to every worker's process group.
  std::function<void()> on_sigusr2;
};

struct SupervisorResult {
  enum class Outcome {
    kSucceeded,    // every worker exited 0
    kFailed,       // a worker failed; first_failure says which
    kInterrupted,  // a signal to the launcher stopped the job; interrupted_by says which
    kStopped,      // stop_fds asked for it
    kRequeued,     // the workers exited with Preemption::kRequeueExitCode: run the job again
  };
  Outcome outcome = Outcome::kSucceeded;
  int exit_code = 0;  // as Supervisor::run returns it (0 when stopped through stop_fds)
  std::optional<WorkerExit> first_failure;
  int interrupted_by = 0;  // a signal told the launcher to stop (also while it was stopping)
};

class Supervisor {
 public:
  // Blocks SIGINT, SIGTERM, SIGHUP and SIGCHLD in the calling thread and opens a signalfd for
  // them; ignores SIGPIPE so that a closed stdout cannot kill the launcher, and makes sure
  // SIGCHLD is not ignored. Construct it before starting any thread (the store server's):
  // threads inherit the mask, so these signals then reach only the signalfd.
  Supervisor();
  // Restores the signal mask and the dispositions of SIGPIPE and SIGCHLD.
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts every worker and supervises them until all have exited. Returns 0 when all succeeded,
  // else the first failure's exit code (128 + signal number when a signal ended it), or
  // 128 + the signal that interrupted the launcher. Throws InvalidArgumentError, before starting
  // anything, when the command cannot be found.
  int run(const SupervisorOptions& options);
  // The same, saying how the job ended.
  SupervisorResult supervise(const SupervisorOptions& options);

  // While no workers run (between the elastic agent's rounds): the signalfd, to poll, and the
  // first pending SIGINT, SIGTERM or SIGHUP (0 when none; SIGCHLDs are dropped).
  int signal_fd() const { return signal_fd_.get(); }
  int take_signal();

 private:
  sigset_t old_mask_;
  struct sigaction old_sigpipe_;
  struct sigaction old_sigchld_;
  net::Fd signal_fd_;
};

// "SIGSEGV" for 11; "signal 99" for numbers without a name.
std::string signal_name(int signal);

}  // namespace dtrain::launch
