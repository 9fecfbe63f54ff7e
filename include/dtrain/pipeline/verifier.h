// The verifier: runs a schedule offline, with no processes, on a model of its costs. It proves that
// every receive has its send and every send its receive, that each pass comes after what it needs
// (a forward after its input arrived, a backward after its forward and its output's gradient),
// that every micro-batch goes forward and backward through every stage exactly once, and that the
// ranks cannot wait on each other in a cycle (deadlock). It reports the first problem, naming the
// rank, the action's index and the action, and otherwise the timeline, the bubble and the most
// micro-batches each rank holds.
//
// The model: passes take their cost; a send never waits (the transport buffers it) and a receive
// waits until its send ran, plus `transfer`. Each rank runs its actions in order.
#pragma once

#include <string>
#include <vector>

#include "dtrain/pipeline/schedule.h"

namespace dtrain::pipeline {

struct Costs {
  double forward = 1;
  double backward_input = 1;  // a whole backward costs backward_input + backward_weight
  double backward_weight = 1;
  double transfer = 0;  // from a send to its receive
};

struct TimedAction {
  int rank;
  int index;  // in the rank's list
  Action action;
  double start, end;
};

struct ScheduleReport {
  bool ok = false;
  std::string error;  // when !ok: the first problem, with rank, action index and action
  double makespan = 0;
  // Idle share of the step: 1 - (sum of the ranks' busy time) / (ranks x makespan).
  double bubble = 0;
  std::vector<double> busy;            // per rank: time in passes
  std::vector<int> peak_microbatches;  // per rank: most micro-batches forwarded but whose
                                       // backward (weight gradient, when split) had not run
  std::vector<TimedAction> timeline;   // every action that ran, in start order per rank
};

ScheduleReport verify(const Schedule& schedule, const Costs& costs = {});

// verify(), throwing InvalidArgumentError with the report's error when the schedule is wrong.
ScheduleReport check(const Schedule& schedule, const Costs& costs = {});

// The cost of a pass under `costs` (0 for sends and receives).
double cost_of(Op op, const Costs& costs);

}  // namespace dtrain::pipeline
