// Dissemination barrier (Hensgen, Finkel & Manber): in round k every rank signals rank r + 2^k
// and waits for rank r - 2^k; after ceil(log2 N) rounds every rank has heard, directly or not,
// from every other, so none can leave before all have arrived.
//
// Cost: ceil(log2 N) alpha, with empty messages.
#include "comm/algorithms/algorithm.h"
#include "comm/algorithms/algorithms.h"

namespace dtrain::comm::algo {

void barrier_dissemination(CollectiveContext& ctx) {
  const int n = ctx.size(), r = ctx.rank();
  for (int k = 1; k < n; k *= 2)
    ctx.send_recv((r + k) % n, nullptr, 0, (r - k + n) % n, nullptr, 0);
}

extern const Algorithm kBarrierDissemination{
    .name = "dissemination",
    .kind = CollectiveKind::kBarrier,
    .file = "barrier_dissemination.cc",
    .formula = "ceil(log2 N) alpha",
    .chosen = "always",
    .cost = [](const CostInput& c) { return c.log2n * c.link.alpha; },
    .run = [](const Invocation& i) { barrier_dissemination(i.ctx); },
};

}  // namespace dtrain::comm::algo
