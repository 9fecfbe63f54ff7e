// `dtrain submit --engine k8s`: a job as Kubernetes manifests (a headless Service and an Indexed
// Job, one pod per node; a Volcano PodGroup when asked), written to LOG_DIR/NAME.yaml and, with
// --apply, applied through kubectl; jobs, logs and cancel through kubectl too.
//
// Each pod runs `dtrain run -n PROCS --nnodes NODES --node-rank $JOB_COMPLETION_INDEX` with the
// store on pod 0 (NAME-0.NAME through the Service), so a pod is a machine of the job as under
// Slurm: GPU sets per rank (--gpus-per-proc), preemption (SIGTERM, a grace period, exit 75 not
// counted as a failure), notifications from pod 0, inputs staged and outputs collected per pod.
#pragma once

#include <string>

#include "launch/submit/job.h"

namespace dtrain::submit {

inline constexpr int kK8sStorePort = 29500;

// The manifests, as YAML documents separated by "---". Throws InvalidArgumentError for what
// Kubernetes cannot do as described (no image, a mail address).
std::string k8s_manifests(const Job& job);

// Writes LOG_DIR/NAME.yaml; applies it when `apply` (prints it instead when dry_run). Returns
// the job's name.
std::string submit_k8s(const Job& job, bool apply, bool dry_run);
void k8s_jobs();
void k8s_logs(const std::string& name);
void k8s_cancel(const std::string& name);

}  // namespace dtrain::submit
