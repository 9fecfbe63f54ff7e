// The smallest dtrain program: every rank contributes its rank number, all-reduce sums them.
//
//   build/bin/dtrain run -n 4 -- build/bin/allreduce
//   [rank 0] rank 0 of 4: sum 6 (expected 6), average 1.5
//
// init_process_group() reads the launcher's variables (dtrain run, torchrun, mpirun, srun), meets
// the other ranks through rank 0's store and connects them: shared memory between processes of
// one machine, TCP between machines. Every call has a timeout; an error names the rank, the peer
// and the operation.
#include <cstdio>
#include <exception>
#include <vector>

#include "dtrain/dtrain.h"

int main() try {
  auto pg = dtrain::init_process_group();
  const int rank = pg->rank(), size = pg->size();

  std::vector<float> sum(1024, static_cast<float>(rank));
  pg->allreduce(dtrain::TensorView::of(sum))->wait();  // op: sum by default

  std::vector<double> mean{static_cast<double>(rank)};
  pg->allreduce(dtrain::TensorView::of(mean), {.op = dtrain::ReduceOp::kAvg})->wait();

  const float expected = size * (size - 1) / 2.0f;
  std::printf("rank %d of %d: sum %g (expected %g), average %g\n", rank, size, sum[0], expected,
              mean[0]);
  for (float v : sum)
    if (v != expected) return 1;
  return 0;
} catch (const std::exception& e) {  // dtrain errors say who, what and how long
  std::fprintf(stderr, "allreduce: %s\n", e.what());
  return 1;
}
