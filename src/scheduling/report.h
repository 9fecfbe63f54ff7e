// What `dtrain sched-sim` prints and draws from simulation results: one row per policy and
// placement, the jobs as JSON, and a chart of the completion times' distribution.
#pragma once

#include <string>
#include <vector>

#include "scheduling/simulator.h"

namespace dtrain::scheduling {

// A table: average, median, 95th and 99th percentile JCT, makespan, GPU utilization, average
// queueing delay and restarts, one row per result.
std::string format_table(const std::vector<SimulationResult>& results);
// Every job of every result (name, application, GPUs, submit, start, finish, JCT, queued,
// restarts) and the summaries, as JSON.
std::string to_json(const std::vector<SimulationResult>& results);
// An SVG chart: the fraction of jobs finished within a JCT (log scale), one line per result.
std::string svg_jct_cdf(const std::vector<SimulationResult>& results);

}  // namespace dtrain::scheduling
