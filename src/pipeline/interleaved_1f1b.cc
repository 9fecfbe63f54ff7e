// Interleaved 1F1B (Narayanan et al., 2021, Megatron-LM): each rank holds v stages (model chunks)
// instead of one, stage s on rank s % p, so a micro-batch goes around the ranks v times. Each pass
// is 1/v as long, and the warm-up and cool-down shrink with it.
//
// Order on rank r: micro-batches go in groups of p; within a group, chunk 0's forwards of the
// group, then chunk 1's, ...; backwards likewise with the chunks in reverse. The rank first runs
// (p-r-1)*2 + (v-1)*p forwards (Megatron's warm-up), then alternates one forward and one
// backward, then runs the backwards left. When m is not a multiple of p the last group is short
// and that warm-up can leave two ranks waiting on each other: the generator then lengthens every
// rank's warm-up together, one forward at a time, until the verifier proves the schedule free of
// deadlock (all forwards first, GPipe's order, always is).
//
// Bubble: (p-1)/(v*m+p-1) of the step with equal micro-batches, v times smaller than 1F1B's,
// for v times as many messages. Memory: rank 0 holds up to (p-1)*2 + (v-1)*p + 1 chunk
// micro-batches, each a chunk's (1/v of a stage's) activations: a little more than 1F1B.
#include <algorithm>

#include "dtrain/pipeline/verifier.h"
#include "pipeline/builtin_schedules.h"

namespace dtrain::pipeline {
namespace {

// The order in which rank r takes its (stage, micro-batch) pairs, forward or backward.
std::vector<Action> chunk_order(const Schedule& s, int r, Op op) {
  const int p = s.ranks, v = s.virtual_stages, m = s.microbatches;
  std::vector<Action> out;
  for (int base = 0; base < m; base += p) {
    const int end = std::min(base + p, m);
    for (int c = 0; c < v; ++c) {
      const int chunk = op == Op::kForward ? c : v - 1 - c;
      for (int i = base; i < end; ++i) out.push_back({op, chunk * p + r, i});
    }
  }
  return out;
}

std::vector<Action> interleave(const std::vector<Action>& forwards,
                               const std::vector<Action>& backwards, size_t warmup) {
  std::vector<Action> out;
  size_t f = 0, b = 0;
  while (f < warmup) out.push_back(forwards[f++]);
  while (f < forwards.size()) {
    out.push_back(forwards[f++]);
    out.push_back(backwards[b++]);
  }
  while (b < backwards.size()) out.push_back(backwards[b++]);
  return out;
}

}  // namespace

ScheduleInfo interleaved_1f1b_schedule() {
  return {.name = "interleaved-1f1b",
          .summary = "v stages per rank (--virtual-stages); bubble (p-1)/(v*m+p-1)",
          .interleaved = true,
          .order = [](Schedule& s) {
            const int p = s.ranks, v = s.virtual_stages;
            const size_t total = size_t(v) * s.microbatches;
            std::vector<std::vector<Action>> forwards(p), backwards(p);
            std::vector<size_t> warmup(p);
            for (int r = 0; r < p; ++r) {
              forwards[r] = chunk_order(s, r, Op::kForward);
              backwards[r] = chunk_order(s, r, Op::kBackward);
              warmup[r] = std::min(size_t((p - r - 1) * 2 + (v - 1) * p), total);
            }
            for (;;) {
              Schedule trial = s;
              for (int r = 0; r < p; ++r)
                trial.actions[r] = interleave(forwards[r], backwards[r], warmup[r]);
              s.actions = trial.actions;
              if (verify(with_communication(std::move(trial))).ok) return;
              bool grew = false;
              for (int r = 0; r < p; ++r) {
                if (warmup[r] < total) {
                  ++warmup[r];
                  grew = true;
                }
              }
              if (!grew) return;  // GPipe's order; make_schedule's caller will see the error
            }
          }};
}

}  // namespace dtrain::pipeline
