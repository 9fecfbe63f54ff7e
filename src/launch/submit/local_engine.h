// `dtrain submit --engine local`: a queue of jobs on this machine (docs/submit.md), for a
// workstation or a test bed: each job runs under `dtrain run`, in containers with
// --container IMAGE (podman, host network, one container per node of the job), one after the
// other in submission order, several at once as long as their ranks fit the CPUs.
//
// The queue is a directory (DTRAIN_QUEUE_DIR, default ~/.local/state/dtrain/queue): a folder per
// job (its script, its state, its restarts) and runner.lock. `dtrain submit` starts a runner
// when none holds the lock; the runner starts jobs, records how each ended, requeues one that
// exits 75 (saved for a requeue) up to --max-restarts, and exits when the queue is empty.
#pragma once

#include <string>

#include "launch/submit/job.h"

namespace dtrain::submit {

// The script one job runs (bash): notifications, staging, `dtrain run` (or one `podman run` per
// node), collecting outputs, the requeue on 75. `port` is the store's port for containers;
// `dtrain` the launcher to run outside them (containers run the image's).
std::string local_script(const Job& job, int port, const std::string& dtrain);

// Queues the job (dry_run: prints its script); starts a runner when none runs. Returns the id.
std::string submit_local(const Job& job, bool dry_run);
void local_jobs();
void local_logs(const std::string& id);
void local_cancel(const std::string& id);

// The runner (`dtrain queue-runner`, started by submit_local): runs the queue until it is
// empty. Returns at once when another runner holds the lock.
int run_local_queue();

}  // namespace dtrain::submit
