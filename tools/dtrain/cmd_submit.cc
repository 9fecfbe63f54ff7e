// `dtrain submit`, `dtrain jobs`, `dtrain logs`, `dtrain cancel`: a training job handed to the
// cluster's own engine (docs/submit.md).
//   dtrain submit --engine slurm --nodes 2 --procs-per-node 8 --gpus-per-proc 1 --gpu-model a100
//       --time 04:00:00 --notify-command 'echo $DTRAIN_JOB_EVENT' -- ./train --checkpoint-dir ckpt
//   dtrain jobs;  dtrain logs 42;  dtrain cancel 42
#include <fmt/format.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "launch/submit/job.h"
#include "launch/submit/slurm_engine.h"
#include "tools/dtrain/commands.h"

namespace dtrain::tools {
namespace {

struct SubmitFlags {
  submit::Job job;
  std::string engine = "slurm";
  std::vector<std::string> env;
  bool dry_run = false;
};

void check_engine(const std::string& engine, const char* command) {
  if (engine != "slurm")
    throw std::runtime_error(fmt::format(
        "dtrain {}: engine '{}' is not supported yet; --engine slurm is (Kubernetes manifests: "
        "deploy/k8s/, docs/deploy.md)",
        command, engine));
}

}  // namespace

CLI::App* add_submit_commands(CLI::App& app) {
  auto f = std::make_shared<SubmitFlags>();
  CLI::App* cmd = app.add_subcommand(
      "submit",
      "Hand a training job to the cluster's engine (Slurm): shape, GPUs, preemption, "
      "notifications (docs/submit.md)");
  auto& j = f->job;
  cmd->add_option("--engine", f->engine, "The cluster's engine: slurm")->capture_default_str();
  cmd->add_option("--name", j.name, "Job name (lowercase letters, digits, '-')")
      ->capture_default_str();
  cmd->add_option("--nodes", j.nodes, "Machines")->capture_default_str();
  cmd->add_option("--procs-per-node", j.procs_per_node, "Ranks per machine")->capture_default_str();
  cmd->add_option("--gpus-per-proc", j.gpus_per_proc, "GPUs per rank")->capture_default_str();
  cmd->add_option("--gpu-model", j.gpu_model, "GPU model (Slurm gres type, e.g. a100)");
  cmd->add_option("--cpus-per-proc", j.cpus_per_proc, "CPUs per rank (0: the engine's default)");
  cmd->add_option("--mem", j.memory,
                  "Memory per machine, e.g. 64G (dtrain estimate says how much)");
  cmd->add_option("--time", j.time_limit, "Time limit, HH:MM:SS or D-HH:MM:SS");
  cmd->add_option("--partition", j.partition, "Slurm partition");
  cmd->add_option("--constraint", j.constraint, "Slurm node features, e.g. 'ib&a100'");
  cmd->add_option("--container", j.container, "Image to run the ranks in (Slurm: pyxis)");
  cmd->add_option("--stage-in", j.stage_in, "SRC:DST copied before the job starts (repeatable)");
  cmd->add_option("--stage-out", j.stage_out, "SRC:DST copied after it ends (repeatable)");
  cmd->add_option("--log-dir", j.log_dir, "Where the output and the submitted script go")
      ->capture_default_str();
  cmd->add_option("--notify-command", j.notify.command,
                  "Run on start, end, failure and requeue, with DTRAIN_JOB_EVENT, DTRAIN_JOB_ID, "
                  "DTRAIN_JOB_NAME, DTRAIN_JOB_STATUS set");
  cmd->add_option("--notify-webhook", j.notify.webhook, "POST each event as JSON to this URL");
  cmd->add_option("--mail", j.notify.mail, "The engine's mail on start, end, failure, requeue");
  cmd->add_option("--max-restarts", j.max_restarts,
                  "Requeues after a preemption (exit 75) before the job counts as failed")
      ->capture_default_str();
  cmd->add_flag("!--not-preemptible", j.preemptible,
                "No preemption warning and no requeue (the job ends when preempted)");
  cmd->add_option("--placement", j.placement,
                  "pack (one switch), spread, or auto: spread while the cluster is mostly idle, "
                  "pack when it is loaded (docs/scheduling.md)")
      ->capture_default_str();
  cmd->add_option("--env", f->env, "NAME=VALUE set for the job (repeatable)");
  cmd->add_flag("--dry-run", f->dry_run, "Print what would be submitted, submit nothing");
  // Everything from the first positional on is the command, its options included (as for
  // `dtrain run`); CLI11 leaves a "--" and unknown options in remaining().
  cmd->add_option("command", j.command, "The program and its arguments, after --")->required();
  cmd->positionals_at_end();
  cmd->allow_extras();
  cmd->callback([f, cmd] {
    for (const auto& extra : cmd->remaining())
      if (extra != "--")
        throw std::runtime_error(fmt::format(
            "dtrain submit: unknown option '{}' (see dtrain submit --help; put the command "
            "after --)",
            extra));
    check_engine(f->engine, "submit");
    for (const auto& e : f->env) {
      const auto eq = e.find('=');
      if (eq == std::string::npos || eq == 0)
        throw std::runtime_error(fmt::format("dtrain submit: --env '{}' must read NAME=VALUE", e));
      f->job.env[e.substr(0, eq)] = e.substr(eq + 1);
    }
    submit::submit_slurm(f->job, f->dry_run);
  });

  auto engine = std::make_shared<std::string>("slurm");
  auto id = std::make_shared<std::string>();
  CLI::App* jobs = app.add_subcommand("jobs", "List your jobs on the cluster's engine");
  jobs->add_option("--engine", *engine, "slurm")->capture_default_str();
  jobs->callback([engine] {
    check_engine(*engine, "jobs");
    submit::slurm_jobs();
  });
  CLI::App* logs = app.add_subcommand("logs", "Print a submitted job's output");
  auto log_dir = std::make_shared<std::string>(".");
  logs->add_option("--engine", *engine, "slurm")->capture_default_str();
  logs->add_option("--log-dir", *log_dir, "Where to look once Slurm has forgotten the job")
      ->capture_default_str();
  logs->add_option("job", *id, "The job's id")->required();
  logs->callback([engine, id, log_dir] {
    check_engine(*engine, "logs");
    submit::slurm_logs(*id, *log_dir);
  });
  CLI::App* cancel = app.add_subcommand("cancel", "Cancel a submitted job");
  cancel->add_option("--engine", *engine, "slurm")->capture_default_str();
  cancel->add_option("job", *id, "The job's id")->required();
  cancel->callback([engine, id] {
    check_engine(*engine, "cancel");
    submit::slurm_cancel(*id);
  });
  return cmd;
}

}  // namespace dtrain::tools
