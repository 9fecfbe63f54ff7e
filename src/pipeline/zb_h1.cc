// ZB-H1 (Qi et al., 2024, "Zero Bubble Pipeline Parallelism"): backward is split into B, the
// gradient of the stage's input (which the previous stage waits for), and W, the gradient of the
// stage's weights (which nothing waits for). B keeps 1F1B's place; each W waits until its rank
// has nothing else it can do, and so fills what would have been bubbles.
//
// How the order is made: a run on unit costs (F = B = W = 1). At each step, rank r runs its next
// 1F1B pass (F or B) when that pass's input is there and, for an F, when it holds fewer than
// min(p, m) micro-batches (held from F until W); otherwise it runs its oldest W waiting; otherwise
// it idles. min(p, m) is what 1F1B's rank 0 holds: later ranks, which hold fewer in 1F1B, spend
// their slack on delaying W, so B passes travel back faster and the W's fill the cool-down. A
// micro-batch waiting only for its W keeps the stage's input and its output's gradient, less
// than a forward's activations, so no rank needs more memory than 1F1B's rank 0 (the paper's
// argument). The order it ran in is the schedule; the runners keep it whatever the real costs.
//
// Bubble: (p-1)/(3m+p-1) with F = B = W, a third of 1F1B's (p-1)*3 idle units over the same 3m
// of work. Memory: min(p, m) micro-batches on every rank, as many as 1F1B's rank 0.
#include <algorithm>
#include <deque>

#include "pipeline/builtin_schedules.h"

namespace dtrain::pipeline {

ScheduleInfo zb_h1_schedule() {
  return {.name = "zb-h1",
          .summary =
              "1F1B with backward split in B and W, W filling the bubbles; bubble (p-1)/(3m+p-1)",
          .interleaved = false,
          .order = [](Schedule& s) {
            const int p = s.ranks, m = s.microbatches;
            constexpr int kNotYet = -1;
            // When each F and B ended (unit time steps), per stage and micro-batch.
            std::vector<std::vector<int>> f_end(p, std::vector<int>(m, kNotYet));
            std::vector<std::vector<int>> b_end = f_end;
            std::vector<std::vector<Action>> order(p);
            std::vector<size_t> next(p, 0);
            std::vector<std::deque<int>> weights(p);
            std::vector<int> held(p, 0);
            for (int r = 0; r < p; ++r) order[r] = one_f_one_b_order(p, r, m, Op::kBackwardInput);
            auto ready = [&](int end, int t) { return end != kNotYet && end <= t; };
            size_t left = size_t(p) * m * 3;
            for (int t = 0; left > 0; ++t) {
              for (int r = 0; r < p; ++r) {
                const int limit = std::min(p, m);
                bool ran = false;
                if (next[r] < order[r].size()) {
                  const Action a = order[r][next[r]];
                  const int i = a.microbatch;
                  const bool can =
                      a.op == Op::kForward
                          ? (r == 0 || ready(f_end[r - 1][i], t)) && held[r] < limit
                          : (r == p - 1 ? ready(f_end[r][i], t) : ready(b_end[r + 1][i], t));
                  if (can) {
                    s.actions[r].push_back(a);
                    if (a.op == Op::kForward) {
                      f_end[r][i] = t + 1;
                      ++held[r];
                    } else {
                      b_end[r][i] = t + 1;
                      weights[r].push_back(i);
                    }
                    ++next[r];
                    ran = true;
                  }
                }
                if (!ran && !weights[r].empty()) {
                  s.actions[r].push_back({Op::kBackwardWeight, r, weights[r].front()});
                  weights[r].pop_front();
                  --held[r];
                  ran = true;
                }
                if (ran) --left;
              }
            }
          }};
}

}  // namespace dtrain::pipeline
