// `dtrain submit`, `dtrain jobs`, `dtrain logs`, `dtrain cancel`: a training job handed to an
// engine (docs/submit.md): Slurm, Kubernetes, or this machine's own queue.
//   dtrain submit --engine slurm --nodes 2 --procs-per-node 8 --gpus-per-proc 1 --gpu-model a100
//       --time 04:00:00 --notify-command 'echo $DTRAIN_JOB_EVENT' -- ./train --checkpoint-dir ckpt
//   dtrain submit --engine k8s --container registry/dtrain:1 --nodes 4 --apply -- ./train
//   dtrain submit --engine local --container localhost/dtrain --nodes 2 -- train_fashion_mnist
//   dtrain submit --file job.yaml;  dtrain jobs;  dtrain logs 42;  dtrain cancel 42
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "launch/submit/job.h"
#include "launch/submit/job_file.h"
#include "launch/submit/k8s_engine.h"
#include "launch/submit/local_engine.h"
#include "launch/submit/memory_probe.h"
#include "launch/submit/slurm_engine.h"
#include "tools/dtrain/commands.h"

namespace dtrain::tools {
namespace {

struct SubmitFlags {
  submit::Job job;
  std::string engine = "slurm";
  std::string file;
  std::vector<std::string> env;
  bool dry_run = false;
  bool apply = false;
  int probe_seconds = 60;
};

void check_engine(const std::string& engine, const char* command) {
  if (engine != "slurm" && engine != "k8s" && engine != "local")
    throw std::runtime_error(fmt::format(
        "dtrain {}: unknown engine '{}': slurm, k8s (Kubernetes) or local (this machine)", command,
        engine));
}

}  // namespace

CLI::App* add_submit_commands(CLI::App& app) {
  auto f = std::make_shared<SubmitFlags>();
  CLI::App* cmd = app.add_subcommand(
      "submit",
      "Hand a training job to an engine (Slurm, Kubernetes, this machine's queue): shape, GPUs, "
      "memory, containers, preemption, notifications (`dtrain docs submit`)");
  auto& j = f->job;
  cmd->add_option("--engine", f->engine, "slurm, k8s (Kubernetes) or local (this machine)")
      ->capture_default_str();
  cmd->add_option("--file", f->file,
                  "A YAML job description, keys named as these flags (flags given win)");
  cmd->add_option("--name", j.name, "Job name (lowercase letters, digits, '-')")
      ->capture_default_str();
  cmd->add_option("--nodes", j.nodes, "Machines (Kubernetes: pods; local: containers)")
      ->capture_default_str();
  cmd->add_option("--procs-per-node", j.procs_per_node, "Ranks per machine")->capture_default_str();
  cmd->add_option("--gpus-per-proc", j.gpus_per_proc, "GPUs per rank")->capture_default_str();
  cmd->add_option("--gpu-model", j.gpu_model,
                  "GPU model (Slurm gres type, e.g. a100; Kubernetes: nvidia.com/gpu.product)");
  cmd->add_option("--cpus-per-proc", j.cpus_per_proc, "CPUs per rank (0: the engine's default)");
  cmd->add_option("--mem", j.memory,
                  "Memory per machine, e.g. 64G, or auto: measured by a short probe run here");
  cmd->add_option("--probe-seconds", f->probe_seconds, "How long --mem auto's probe run may take")
      ->capture_default_str();
  cmd->add_option("--time", j.time_limit, "Time limit, HH:MM:SS or D-HH:MM:SS");
  cmd->add_option("--partition", j.partition, "Slurm partition; Kubernetes: the Kueue queue");
  cmd->add_option("--constraint", j.constraint, "Slurm node features, e.g. 'ib&a100'");
  cmd->add_option("--container", j.container,
                  "Image to run the ranks in (Slurm: pyxis; Kubernetes; local: podman)");
  cmd->add_option("--stage-in", j.stage_in, "SRC:DST copied before the job starts (repeatable)");
  cmd->add_option("--stage-out", j.stage_out, "SRC:DST copied after it ends (repeatable)");
  cmd->add_option("--log-dir", j.log_dir, "Where the output and the submitted script go")
      ->capture_default_str();
  cmd->add_option("--notify-command", j.notify.command,
                  "Run on start, end, failure and requeue, with DTRAIN_JOB_EVENT, DTRAIN_JOB_ID, "
                  "DTRAIN_JOB_NAME, DTRAIN_JOB_STATUS set");
  cmd->add_option("--notify-webhook", j.notify.webhook, "POST each event as JSON to this URL");
  cmd->add_option("--mail", j.notify.mail, "Slurm's mail on start, end, failure, requeue");
  cmd->add_option("--max-restarts", j.max_restarts,
                  "Requeues after a preemption (exit 75) before the job counts as failed")
      ->capture_default_str();
  cmd->add_flag("!--not-preemptible", j.preemptible,
                "No preemption warning and no requeue (the job ends when preempted)");
  cmd->add_option("--placement", j.placement,
                  "pack (one switch), spread, or auto: spread while the cluster is mostly idle, "
                  "pack when it is loaded (`dtrain docs scheduling`)")
      ->capture_default_str();
  cmd->add_option("--topology-key", j.topology_key,
                  "Kubernetes: the node label naming a rack or switch, for pack and spread")
      ->capture_default_str();
  cmd->add_flag("--volcano", j.volcano, "Kubernetes: gang-schedule the pods (Volcano PodGroup)");
  cmd->add_flag("--apply", f->apply, "Kubernetes: apply the manifests through kubectl");
  cmd->add_option("--env", f->env, "NAME=VALUE set for the job (repeatable)");
  cmd->add_flag("--dry-run", f->dry_run, "Print what would be submitted, submit nothing");
  // Everything from the first positional on is the command, its options included (as for
  // `dtrain run`); CLI11 leaves a "--" and unknown options in remaining().
  cmd->add_option("command", j.command, "The program and its arguments, after --");
  cmd->positionals_at_end();
  cmd->allow_extras();
  cmd->callback([f, cmd] {
    for (const auto& extra : cmd->remaining())
      if (extra != "--")
        throw std::runtime_error(fmt::format(
            "dtrain submit: unknown option '{}' (see dtrain submit --help; put the command "
            "after --)",
            extra));
    auto& job = f->job;
    if (!f->file.empty()) {
      const std::string engine = submit::load_job_file(f->file, job, [cmd](const std::string& key) {
        return cmd->count(key == "command" ? "command" : "--" + key) > 0;
      });
      if (!engine.empty() && cmd->count("--engine") == 0) f->engine = engine;
    }
    check_engine(f->engine, "submit");
    for (const auto& e : f->env) {
      const auto eq = e.find('=');
      if (eq == std::string::npos || eq == 0)
        throw std::runtime_error(fmt::format("dtrain submit: --env '{}' must read NAME=VALUE", e));
      job.env[e.substr(0, eq)] = e.substr(eq + 1);
    }
    if (job.command.empty())
      throw std::runtime_error(
          "dtrain submit: no command: put it after --, e.g. -- python3 train.py (or command: in "
          "--file)");
    if (job.memory == "auto") {
      if (f->probe_seconds < 1 || f->probe_seconds > 3600)
        throw std::runtime_error(
            fmt::format("--probe-seconds {} must be 1 to 3600", f->probe_seconds));
      submit::Job checked = job;  // the rest of the description is right before probing
      checked.memory.clear();
      checked.validate();
      const auto probe = submit::probe_memory(job, std::chrono::seconds(f->probe_seconds));
      job.memory = probe.memory;
      std::printf("# --mem auto: %s per node\n", probe.describe().c_str());
      std::fflush(stdout);
    }
    if (f->engine == "slurm") submit::submit_slurm(job, f->dry_run);
    if (f->engine == "k8s") submit::submit_k8s(job, f->apply, f->dry_run);
    if (f->engine == "local") submit::submit_local(job, f->dry_run);
  });

  auto engine = std::make_shared<std::string>("slurm");
  auto id = std::make_shared<std::string>();
  const char* engine_help = "slurm, k8s or local";
  CLI::App* jobs = app.add_subcommand("jobs", "List your jobs on an engine");
  jobs->add_option("--engine", *engine, engine_help)->capture_default_str();
  jobs->callback([engine] {
    check_engine(*engine, "jobs");
    if (*engine == "slurm") submit::slurm_jobs();
    if (*engine == "k8s") submit::k8s_jobs();
    if (*engine == "local") submit::local_jobs();
  });
  CLI::App* logs = app.add_subcommand("logs", "Print a submitted job's output");
  auto log_dir = std::make_shared<std::string>(".");
  logs->add_option("--engine", *engine, engine_help)->capture_default_str();
  logs->add_option("--log-dir", *log_dir, "Slurm: where to look once Slurm has forgotten the job")
      ->capture_default_str();
  logs->add_option("job", *id, "The job's id (Kubernetes: its name)")->required();
  logs->callback([engine, id, log_dir] {
    check_engine(*engine, "logs");
    if (*engine == "slurm") submit::slurm_logs(*id, *log_dir);
    if (*engine == "k8s") submit::k8s_logs(*id);
    if (*engine == "local") submit::local_logs(*id);
  });
  CLI::App* cancel = app.add_subcommand("cancel", "Cancel a submitted job");
  cancel->add_option("--engine", *engine, engine_help)->capture_default_str();
  cancel->add_option("job", *id, "The job's id (Kubernetes: its name)")->required();
  cancel->callback([engine, id] {
    check_engine(*engine, "cancel");
    if (*engine == "slurm") submit::slurm_cancel(*id);
    if (*engine == "k8s") submit::k8s_cancel(*id);
    if (*engine == "local") submit::local_cancel(*id);
  });
  // Started by `dtrain submit --engine local`; not for users (no group: not in --help).
  CLI::App* runner = app.add_subcommand("queue-runner", "Runs this machine's job queue");
  runner->group("");
  runner->callback([] {
    const int rc = submit::run_local_queue();
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
  return cmd;
}

}  // namespace dtrain::tools
