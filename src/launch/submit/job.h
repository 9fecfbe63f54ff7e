// A training job as `dtrain submit` describes it to a cluster's engine (docs/submit.md): what to
// run, on how many machines and GPUs, with what memory and time, what to do when it is
// preempted, and whom to tell when it starts, ends, fails or is requeued.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace dtrain::submit {

struct Notify {
  std::string command;  // run on each event with DTRAIN_JOB_EVENT, DTRAIN_JOB_ID, DTRAIN_JOB_NAME
  std::string webhook;  // an http(s) URL that gets {"job": ..., "event": ..., ...} POSTed (curl)
  std::string mail;     // an address for the engine's own mail (Slurm --mail-user)
};

struct Job {
  std::string name = "dtrain";
  std::vector<std::string> command;  // the program and its arguments, run on every rank
  int nodes = 1;
  int procs_per_node = 1;
  int gpus_per_proc = 0;
  std::string gpu_model;  // "a100": Slurm gres type, Kubernetes node label value
  int cpus_per_proc = 0;
  std::string memory;                 // per node, Slurm's syntax ("64G"); "" = the engine's default
  std::string time_limit;             // "HH:MM:SS" or "D-HH:MM:SS"
  std::string partition;              // Slurm partition; Kubernetes: the Kueue queue
  std::string constraint;             // Slurm node features (--constraint), e.g. "ib&a100"
  std::string container;              // image to run the ranks in
  std::vector<std::string> stage_in;  // "SRC:DST": copied before the job starts
  std::vector<std::string> stage_out;  // "SRC:DST": copied after it ends, whatever its status
  std::string log_dir = ".";           // where the job's output and its submitted script go
  Notify notify;
  int max_restarts = 3;     // requeues after a preemption (exit 75) before it counts as failed
  bool preemptible = true;  // ask for a warning signal and requeue on exit 75
  std::string placement = "auto";  // pack | spread | auto (docs/scheduling.md)
  std::map<std::string, std::string> env;
  // Kubernetes: the node label that names a rack or switch, for pack and spread, and whether to
  // gang-schedule the pods with a Volcano PodGroup.
  std::string topology_key = "topology.kubernetes.io/zone";
  bool volcano = false;

  // Throws InvalidArgumentError naming the field and what it must be.
  void validate() const;
};

// A command line run through /bin/sh to its end: its exit status (-1 when it could not run or a
// signal ended it) and its stdout and stderr together.
struct ShellOutput {
  int status = -1;
  std::string text;
};
ShellOutput run_shell(const std::string& command);

// Writes `text` to DIR/FILE (making DIR); returns the path. Throws naming the path and errno.
std::string write_job_file(const std::string& dir, const std::string& file,
                           const std::string& text);

// `text` as one word for a POSIX shell: 'it'\''s'.
std::string shell_quote(const std::string& text);
std::string shell_join(const std::vector<std::string>& words);

// Shell lines that copy each --stage-in SRC:DST before the job (a failure ends the script with 1,
// told as a failure when `notifying`), and each --stage-out after it (a failure is reported and
// the job's status kept). One command per line.
std::string stage_in_commands(const Job& job, bool notifying);
std::string stage_out_commands(const Job& job);

// A bash function `notify EVENT [STATUS]` for job scripts: runs notify.command and POSTs to
// notify.webhook, never failing the job when either fails. Empty when there is nothing to tell.
std::string notify_function(const Job& job, const std::string& id_variable);

}  // namespace dtrain::submit
