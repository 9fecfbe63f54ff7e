// What `dtrain bench` prints: one nccl-tests style table per collective, dtrain's columns first
// and each other implementation's time and ratio beside them, and the results as JSON lines.
// Over several rounds each number is the median of the rounds and each ratio the median of the
// rounds' ratios, with its range.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "tools/dtrain/bench_plan.h"

namespace dtrain::tools {

// `peers`: the columns beside dtrain's, in order (a peer's impl name, or "dtrain-gloo", ...);
// `rounds`: how many rounds `results` hold.
void print_tables(const Plan& p, const std::vector<bench::Result>& results,
                  const std::vector<std::string>& peers, int rounds, std::FILE* out);

// Every result as one JSON object per line (--json); throws InvalidArgumentError when it cannot.
void write_json(const std::string& path, const std::vector<bench::Result>& results);

}  // namespace dtrain::tools
