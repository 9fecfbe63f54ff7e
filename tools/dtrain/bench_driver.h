// `dtrain bench` as the driver (no RANK or OMPI_COMM_WORLD_RANK in the environment): it starts N
// ranks of itself against a store it hosts, then each requested peer (bench_peers.h), each
// implementation's processes under the launcher's supervisor (launch/supervisor.h, as under
// `dtrain run`) and a deadline, in rounds; it collects the JSON result line each prints from
// rank 0 and prints the tables (bench_report.h).
#pragma once

#include "tools/dtrain/bench_plan.h"

namespace dtrain::tools {

// 0 when every implementation ran and every result was right, else 1 (having said why).
int run_driver(const BenchArgs& a);

}  // namespace dtrain::tools
