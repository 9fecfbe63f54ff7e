// `dtrain chaos`: a job run under a seeded fault schedule and once without faults, and what the
// faults cost it (tools/dtrain/cmd_chaos.cc; docs/fault_tolerance.md, "dtrain chaos").
//
// The job is a `dtrain run` command. Each run gets a directory of its own under
// ChaosOptions::dir with the job's stdout and stderr, its flight records (DTRAIN_FLIGHT_DIR,
// where the workers' beat pages name their pids), its sample log (DTRAIN_SAMPLE_LOG: one line
// per trained sample, launch/sample_ledger.h) and that log's growth (progress.tsv: seconds since
// the run's start, lines logged by then). Faults go to workers found through their beats
// (a worker joins them when its world group forms), drawn from the seed. The schedule counts from
// the job's first trained sample; for a job that logs none, from its workers' first call (once
// 10 s have passed without a sample). A disk fault fills the file system of
// ChaosOptions::fill_dir (the job's checkpoints') with one file, which it removes FOR later;
// `{run}` in the job's command stands for the run's name, so that the two runs keep their
// checkpoints apart (--checkpoint-dir /mnt/small/{run}). A cut fault drops every packet of the
// victim's host but loopback's with nftables for FOR: the host is a network namespace
// (scripts/netns-hosts.sh runs a job's nodes on such hosts), never this machine's own. A store
// fault sends SIGKILL to the job's process listening on the workers' MASTER_PORT and, when it
// runs on an emulated host, to every process there.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "launch/fault_schedule.h"
#include "launch/sample_ledger.h"

namespace dtrain::launch {

struct ChaosOptions {
  std::vector<std::string> command;  // the job
  std::vector<FaultRule> schedule;
  uint64_t seed = 1;
  int max_faults = -1;   // stop injecting after this many (-1: as long as the job runs)
  bool baseline = true;  // also run the job once without faults (first)
  std::string dir;       // the runs' directories go here
  std::string fill_dir;  // disk faults fill its file system
  std::chrono::seconds timeout{3600};  // per run: then the job is stopped and the run fails
  int out_fd = 2;                      // where progress lines go
};

struct ChaosRun {
  std::string name;  // "baseline", "faults"
  std::string dir;
  int exit_code = -1;
  double wall_s = 0;                 // start to exit
  std::optional<double> final_loss;  // from the job's last `RESULT {...}` line
  // Also from it: the loss on fixed data once training has ended, which does not depend on
  // which rank trained which batch as the last steps' losses do.
  std::optional<double> eval_loss;
  std::optional<SampleLedger> ledger;  // when the job wrote a sample log
  int faults = 0;
  int recovered = 0;  // faults after which the job trained again, or (the last) ended well
  std::vector<double> recovery_s;  // per recovered fault: the fault to the next step logged
  // The sample log's lines as the run went: (seconds since its start, lines then), at each change.
  std::vector<std::pair<double, int64_t>> progress;
  // Per fault, on the same clock: when it was injected and when it was lifted (a kill: then too).
  std::vector<std::pair<double, double>> fault_spans;
  // goodput_in_run(progress, its lineage's trainings, fault_spans)
  std::optional<double> goodput_in_run;
};

struct PaceOptions {
  double settle_s = 5;        // a stretch starts this long after its start or a fault was lifted
  double min_stretch_s = 10;  // shorter stretches tell no pace
};

// Goodput within one run, which the machine's speed drifting between two runs does not move:
// the samples the run trained (its lineage's trainings), at its own pace between faults, over
// the time from its first logged sample to its last. Its pace: the median over the stretches
// between faults (each from `settle_s` after the first sample or after a fault was lifted, to
// the next fault) of the least-squares slope of the lines logged against time. A slope, not
// lines counted in fixed windows: a window holds a whole number of steps, so its rate moves in
// steps of one step's samples. A run without faults measures about 1. nullopt when no stretch
// is `min_stretch_s` long.
std::optional<double> goodput_in_run(const std::vector<std::pair<double, int64_t>>& progress,
                                     int64_t trained,
                                     const std::vector<std::pair<double, double>>& fault_spans,
                                     const PaceOptions& options = {});

struct ChaosReport {
  std::optional<ChaosRun> baseline;
  ChaosRun faults;
};

// Runs the job (without faults first, when asked), then under the schedule.
ChaosReport run_chaos(const ChaosOptions& options);

// The report's last line: CHAOS {"faults":..,"recovered":..,"goodput":..,"steps_lost":..,
// "samples_lost":..,"samples_repeated":..,"final_loss":..,"baseline_loss":..,"eval_loss":..,
// "baseline_eval_loss":..,...}; a value that could not be measured is null.
std::string chaos_line(const ChaosReport& report);

}  // namespace dtrain::launch
