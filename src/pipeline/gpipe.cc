// GPipe (Huang et al., 2019): each rank runs the forward of every micro-batch, then the backward
// of every micro-batch.
//
//   rank 0  F0 F1 F2 F3 .  .  .  .  .  .  B0 B0 B1 B1 B2 B2 B3 B3
//   rank 1  .  F0 F1 F2 F3 .  .  .  B0 B0 B1 B1 B2 B2 B3 B3 .  .
//   ...
// Bubble: the first micro-batch needs p-1 forwards to reach the last stage and its gradient p-1
// backwards to come back, so with m micro-batches of equal cost each rank idles for (p-1) of
// (m+p-1) slots: (p-1)/(m+p-1) of the step. Memory: every rank holds the activations of all m
// micro-batches at the end of the forwards, which is what 1F1B improves on.
#include "pipeline/builtin_schedules.h"

namespace dtrain::pipeline {

ScheduleInfo gpipe_schedule() {
  return {
      .name = "gpipe",
      .summary = "all forwards, then all backwards; bubble (p-1)/(m+p-1), holds m micro-batches",
      .interleaved = false,
      .order = [](Schedule& s) {
        for (int r = 0; r < s.ranks; ++r) {
          for (int i = 0; i < s.microbatches; ++i) s.actions[r].push_back({Op::kForward, r, i});
          for (int i = 0; i < s.microbatches; ++i) s.actions[r].push_back({Op::kBackward, r, i});
        }
      }};
}

}  // namespace dtrain::pipeline
