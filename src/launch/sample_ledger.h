// What a job trained, sample by sample, from its sample log: one "epoch index step restart"
// line per sample a rank trained (train_fashion_mnist --sample-log, or DTRAIN_SAMPLE_LOG).
//
// After a failure and a restart from a commit, the steps since that commit are trained again,
// so a step can appear under several restarts (DTRAIN_RESTART_COUNT). The state training went
// on from is the latest restart's: for each step the ledger keeps that restart's lines (the
// lineage) and counts the others as work thrown away. `dtrain chaos` compares the lineage of a
// run under faults with that of a run without, sample by sample.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace dtrain::launch {

struct SampleLedger {
  // Times each (epoch, sample index) was trained in the lineage.
  std::map<std::pair<int64_t, int64_t>, int64_t> trained;
  int64_t steps = 0;         // distinct steps in the lineage
  int64_t steps_redone = 0;  // (step, restart) pairs that a later restart trained again
  int64_t lines = 0;

  // Reads `path`. Throws InvalidArgumentError naming the file and line of a malformed line (a
  // killed writer's cut last line is dropped: it loses at most that write).
  static SampleLedger read(const std::string& path);
};

struct LedgerComparison {
  int64_t lost = 0;      // trainings of a sample the reference has and this run lacks
  int64_t repeated = 0;  // trainings of a sample beyond the reference's
};
// `run` against `reference`, sample by sample.
LedgerComparison compare_ledgers(const SampleLedger& run, const SampleLedger& reference);

}  // namespace dtrain::launch
