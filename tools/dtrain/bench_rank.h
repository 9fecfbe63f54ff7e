// `dtrain bench` as one rank of a job (under `dtrain run`, mpirun, or the driver's own ranks):
// it measures dtrain's side only, through bench/bench_common.h's timing loop and checks.
#pragma once

#include "tools/dtrain/bench_plan.h"

namespace dtrain::tools {

// Times every collective and size of the plan on the group this process joins; rank 0 prints
// the table (or, with --jsonl, the result lines the driver collects). 0 when every result was
// right, 1 when some were wrong; throws on a failed operation.
int run_rank(const BenchArgs& a);

}  // namespace dtrain::tools
