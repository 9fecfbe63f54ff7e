// 1F1B (PipeDream-Flush, Narayanan et al., 2021): rank r first runs p-r-1 forwards (warm-up), then
// alternates one forward and one backward (steady state), then runs the backwards left
// (cool-down).
//
//   rank 0  F0 F1 F2 F3 .  .  B0 B0 F4 B1 B1 ...
//   rank 3  .  .  .  F0 B0 B0 F1 B1 B1 F2 ...
// Bubble: the same as GPipe's, (p-1)/(m+p-1) with equal micro-batches: the warm-up and cool-down
// idle the same slots. Memory: a micro-batch's activations are freed by its backward, so rank r
// holds at most min(p-r, m) micro-batches instead of m: the reason to prefer it over GPipe.
#include <algorithm>

#include "pipeline/builtin_schedules.h"

namespace dtrain::pipeline {

std::vector<Action> one_f_one_b_order(int ranks, int rank, int m, Op backward) {
  std::vector<Action> out;
  const int warmup = std::min(ranks - rank - 1, m);
  int forward = 0;
  int back = 0;
  while (forward < warmup) out.push_back({Op::kForward, rank, forward++});
  while (forward < m) {
    out.push_back({Op::kForward, rank, forward++});
    out.push_back({backward, rank, back++});
  }
  while (back < m) out.push_back({backward, rank, back++});
  return out;
}

ScheduleInfo one_f_one_b_schedule() {
  return {.name = "1f1b",
          .summary = "warm-up, then one forward one backward; bubble (p-1)/(m+p-1), holds p-r",
          .interleaved = false,
          .order = [](Schedule& s) {
            for (int r = 0; r < s.ranks; ++r)
              s.actions[r] = one_f_one_b_order(s.ranks, r, s.microbatches, Op::kBackward);
          }};
}

}  // namespace dtrain::pipeline
