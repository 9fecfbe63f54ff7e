#include "launch/submit/slurm_engine.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/preemption.h"

namespace dtrain::submit {
namespace {

using Output = ShellOutput;
Output run(const std::string& command) { return run_shell(command); }

void check_id(const std::string& id) {
  if (!std::regex_match(id, std::regex("[0-9]+(_[0-9]+)?")))
    throw InvalidArgumentError(fmt::format("dtrain: '{}' is not a Slurm job id", id));
}

}  // namespace

std::string slurm_script(const Job& job, const std::string& placement) {
  namespace fs = std::filesystem;
  const std::string log = (fs::path(job.log_dir) / (job.name + "-%j.out")).string();
  std::string s =
      "#!/bin/bash\n# Written by `dtrain submit --engine slurm` (`dtrain docs submit`).\n";
  auto sbatch = [&](const std::string& line) { s += "#SBATCH " + line + "\n"; };
  sbatch("--job-name=" + job.name);
  sbatch(fmt::format("--nodes={}", job.nodes));
  sbatch(fmt::format("--ntasks-per-node={}", job.procs_per_node));
  // GPUs per task (a task count makes Slurm accept it): srun then binds each task to its own
  // (below), as `dtrain run --gpus-per-proc` does.
  if (job.gpus_per_proc > 0) {
    sbatch(fmt::format("--ntasks={}", job.nodes * job.procs_per_node));
    sbatch(fmt::format("--gpus-per-task={}{}", job.gpu_model.empty() ? "" : job.gpu_model + ":",
                       job.gpus_per_proc));
  }
  if (job.cpus_per_proc > 0) sbatch(fmt::format("--cpus-per-task={}", job.cpus_per_proc));
  if (!job.memory.empty()) sbatch("--mem=" + job.memory);
  if (!job.time_limit.empty()) sbatch("--time=" + job.time_limit);
  if (!job.partition.empty()) sbatch("--partition=" + job.partition);
  if (!job.constraint.empty()) sbatch("--constraint=" + shell_quote(job.constraint));
  // Pack: every node under one leaf switch, waiting up to 10 minutes for such a set before
  // taking any. Spread: no constraint (Slurm has no option to spread a fixed number of nodes).
  if (placement == "pack" && job.nodes > 1) sbatch("--switches=1@10:00");
  sbatch("--output=" + log);
  sbatch("--open-mode=append");  // a requeued job appends to the same file
  if (job.preemptible) {
    sbatch("--signal=USR1@90");  // the warning: dtrain::Preemption saves and exits 75
    sbatch("--requeue");
  } else {
    sbatch("--no-requeue");
  }
  if (!job.notify.mail.empty()) {
    sbatch("--mail-type=BEGIN,END,FAIL,REQUEUE");
    sbatch("--mail-user=" + job.notify.mail);
  }
  s += "set -uo pipefail\n\n";
  s += notify_function(job, "$SLURM_JOB_ID");
  const bool notifying = !job.notify.command.empty() || !job.notify.webhook.empty();
  auto event = [&](const std::string& e, const std::string& status = "") {
    return notifying ? "notify " + e + (status.empty() ? "" : " " + status) + "\n" : "";
  };
  const std::string stage_out = stage_out_commands(job);  // one command per line
  // Cancelled, or killed at the time limit, the script gets SIGTERM: the outputs are still
  // collected and the end is still told (the trap's text is single-quoted: quotes escaped).
  std::string on_term = "echo \"dtrain: job $SLURM_JOB_ID was stopped (SIGTERM)\" >&2; ";
  for (size_t p = 0, q; p < stage_out.size(); p = q + 1) {
    q = stage_out.find('\n', p);
    on_term += stage_out.substr(p, q - p) + "; ";
  }
  if (notifying) on_term += "notify failure 143; ";
  on_term += "exit 143";
  std::string escaped;
  for (char c : on_term) escaped += c == '\'' ? std::string("'\\''") : std::string(1, c);
  s += "trap '" + escaped + "' TERM\n";
  for (const auto& [k, v] : job.env) s += fmt::format("export {}={}\n", k, shell_quote(v));
  s += "MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n"
       "MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 10000))}\n"
       "export MASTER_ADDR MASTER_PORT\n"
       "restart=${SLURM_RESTART_COUNT:-0}\n"
       "echo \"dtrain: job $SLURM_JOB_ID (restart $restart), $SLURM_NTASKS tasks on "
       "$SLURM_JOB_NODELIST, store at $MASTER_ADDR:$MASTER_PORT\"\n";
  s += event("start", "$restart");
  s += stage_in_commands(job, notifying);
  // No --kill-on-bad-exit for a preemptible job: its ranks exit 75 one after the other once all
  // have saved, and srun would kill the last ones and report their signal instead of 75. A rank
  // that fails ends the others anyway: dtrain fails every rank whose peer died.
  std::string srun = job.preemptible ? "srun" : "srun --kill-on-bad-exit=1";
  // Since Slurm 22.05 srun no longer takes --cpus-per-task from the allocation: say it again.
  if (job.cpus_per_proc > 0) srun += fmt::format(" --cpus-per-task={}", job.cpus_per_proc);
  // Each task sees only its own GPUs, numbered from 0 (CUDA_VISIBLE_DEVICES).
  if (job.gpus_per_proc > 0) {
    srun += fmt::format(" --gpus-per-task={0} --gpu-bind=per_task:{0}", job.gpus_per_proc);
    s += fmt::format(
        "echo \"dtrain: each rank sees its own {0} GPU(s), as CUDA devices 0 to {1} "
        "(srun --gpu-bind=per_task:{0}); pick cuda:0, not the local rank\"\n",
        job.gpus_per_proc, job.gpus_per_proc - 1);
  }
  if (!job.container.empty()) srun += " --container-image=" + shell_quote(job.container);
  s += fmt::format("status=0\n{} {} || status=$?\n", srun, shell_join(job.command));
  s += stage_out;
  if (job.preemptible)
    s += fmt::format(
        "if [ \"$status\" -eq {0} ] && [ \"$restart\" -lt {1} ]; then\n"
        "  echo \"dtrain: job $SLURM_JOB_ID saved its state for a requeue (restart $restart of "
        "{1}); requeueing\"\n"
        "{2}"
        "  scontrol requeue \"$SLURM_JOB_ID\"\n"
        "  exit \"$status\"\n"
        "fi\n",
        Preemption::kRequeueExitCode, job.max_restarts,
        notifying ? "  notify requeue \"$status\"\n" : "");
  if (notifying)
    s += "if [ \"$status\" -eq 0 ]; then notify end 0; else notify failure \"$status\"; fi\n";
  s += "exit \"$status\"\n";
  return s;
}

std::string slurm_auto_placement(const std::string& partition, std::string* why) {
  const Output o =
      run(partition.empty() ? "sinfo -h -o %C" : "sinfo -h -o %C -p " + shell_quote(partition));
  std::smatch m;
  static const std::regex kCpus(R"((\d+)/(\d+)/(\d+)/(\d+))");  // allocated/idle/other/total
  if (o.status != 0 || !std::regex_search(o.text, m, kCpus) || std::stod(m[4]) <= 0) {
    *why = "sinfo did not say the cluster's load; packing";
    return "pack";
  }
  const double idle = std::stod(m[2]) / std::stod(m[4]);
  *why = fmt::format("{:.0f}% of the cluster's CPUs idle", 100 * idle);
  return idle >= 0.5 ? "spread" : "pack";
}

std::string submit_slurm(const Job& job, bool dry_run) {
  job.validate();
  std::string placement = job.placement, why = "asked for";
  if (placement == "auto") placement = slurm_auto_placement(job.partition, &why);
  const std::string script = slurm_script(job, placement);
  if (dry_run) {
    std::printf("# placement %s (%s)\n%s", placement.c_str(), why.c_str(), script.c_str());
    return "";
  }
  namespace fs = std::filesystem;
  const std::string path = write_job_file(job.log_dir, job.name + ".sbatch", script);
  const Output o = run("sbatch --parsable " + shell_quote(path));
  // --parsable prints "ID" or "ID;CLUSTER" on a line of its own; warnings may come before it.
  std::string id;
  std::istringstream lines(o.text);
  for (std::string line; id.empty() && std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_match(line, m, std::regex(R"((\d+)(;\S+)?\s*)"))) id = m[1];
  }
  if (o.status != 0 || id.empty())
    throw InvalidArgumentError(
        fmt::format("dtrain submit: sbatch refused {} (exit {}): {}", path, o.status, o.text));
  std::printf(
      "submitted job %s to Slurm: %s, %d node(s) x %d rank(s), placement %s (%s); "
      "script %s; output %s\n",
      id.c_str(), job.name.c_str(), job.nodes, job.procs_per_node, placement.c_str(), why.c_str(),
      path.c_str(), (fs::path(job.log_dir) / (job.name + "-" + id + ".out")).c_str());
  return id;
}

void slurm_jobs() {
  const Output o = run("squeue -h -u \"$(id -un)\" -o '%i %j %T %M %D %R'");
  if (o.status != 0) throw InvalidArgumentError("dtrain jobs: squeue failed: " + o.text);
  std::printf("%-10s %-24s %-12s %-10s %-5s %s\n", "JOB", "NAME", "STATE", "TIME", "NODES",
              "WHERE/WHY");
  std::istringstream lines(o.text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    std::string id, name, state, time, nodes, reason;
    in >> id >> name >> state >> time >> nodes;
    std::getline(in >> std::ws, reason);
    std::printf("%-10s %-24s %-12s %-10s %-5s %s\n", id.c_str(), name.c_str(), state.c_str(),
                time.c_str(), nodes.c_str(), reason.c_str());
  }
}

void slurm_logs(const std::string& id, const std::string& log_dir) {
  check_id(id);
  namespace fs = std::filesystem;
  const Output o = run("scontrol -o show job " + id);
  std::smatch m;
  std::string path;
  if (o.status == 0 && std::regex_search(o.text, m, std::regex(R"(StdOut=(\S+))"))) {
    path = m[1];
  } else {
    // Slurm forgets finished jobs after a while (MinJobAge): the file dtrain submit named.
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(log_dir, ec))
      if (e.path().filename().string().ends_with("-" + id + ".out")) path = e.path().string();
    if (path.empty())
      throw InvalidArgumentError(fmt::format(
          "dtrain logs: Slurm does not know job {} any more and {} holds no *-{}.out; give "
          "--log-dir as it was given to dtrain submit",
          id, log_dir, id));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw InvalidArgumentError(fmt::format(
        "dtrain logs: job {} writes to {}, which cannot be read from here (not started yet, or "
        "on another machine's disk)",
        id, path));
  std::fputs(std::string(std::istreambuf_iterator<char>(in), {}).c_str(), stdout);
}

void slurm_cancel(const std::string& id) {
  check_id(id);
  const Output o = run("scancel " + id);
  if (o.status != 0)
    throw InvalidArgumentError(fmt::format("dtrain cancel: scancel {} failed: {}", id, o.text));
  std::printf("cancelled Slurm job %s\n", id.c_str());
}

}  // namespace dtrain::submit
