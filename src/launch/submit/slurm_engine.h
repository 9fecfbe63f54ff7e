// `dtrain submit --engine slurm`: a job as an sbatch script, submitted, listed, read and
// cancelled through Slurm's own commands (sbatch, squeue, scontrol, scancel).
#pragma once

#include <string>

#include "launch/submit/job.h"

namespace dtrain::submit {

// The batch script: #SBATCH lines for the shape (nodes, tasks, --gres=gpu:MODEL:N, memory, time,
// partition, constraint), the placement (pack: --switches=1@10:00; spread: none), preemption
// (--signal=USR1@90, --requeue: exit 75 requeues up to max_restarts times), mail and output; then
// staging in, `srun` of the command on every rank, staging out, and the notifications.
// `placement` is pack or spread (auto is resolved from the cluster's load by submit_slurm).
std::string slurm_script(const Job& job, const std::string& placement);

// pack or spread for --placement auto: spread while at least half of the partition's CPUs are
// idle (sinfo), pack once it is loaded, as docs/scheduling.md found best; pack when sinfo fails.
std::string slurm_auto_placement(const std::string& partition, std::string* why);

// Writes the script to LOG_DIR/NAME.sbatch and submits it (dry_run: prints it instead). Prints
// what it did; returns the job id ("" for a dry run). Throws naming sbatch's own error.
std::string submit_slurm(const Job& job, bool dry_run);
void slurm_jobs();  // squeue: this user's jobs
// The job's output file, from Slurm, or LOG_DIR/*-ID.out once Slurm has forgotten the job.
void slurm_logs(const std::string& id, const std::string& log_dir);
void slurm_cancel(const std::string& id);

}  // namespace dtrain::submit
