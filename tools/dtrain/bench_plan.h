// What `dtrain bench` is asked to do: its arguments as given (BenchArgs) and what they mean once
// checked (Plan). The rank mode (bench_rank.h), the driver (bench_driver.h) and the report
// (bench_report.h) all read them.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "comm/collective.h"

namespace dtrain::tools {

inline constexpr const char* kDefaultSizes = "4K,64K,1M,16M,64M";

struct BenchArgs {
  std::string collectives;  // COLL, or a comma-separated list, or "all"
  int np = 2;
  std::string sizes = kDefaultSizes;
  std::string dtype = "f32";
  std::string op = "sum";
  int iters = 20;
  int warmup = 5;
  int rounds = 1;  // the driver runs every implementation this many times, alternating
  bool check = true;
  std::string json_file;
  std::string peers;
  std::string transport = "auto";
  std::string bind = "auto";  // dtrain's ranks, as `dtrain run --bind` places them
  double straggle_ms = 0;
  std::string backend;  // "" = DTRAIN_BACKEND (native by default)
  std::string algo;
  // all_reduce's wire (AllreduceOptions::wire): exact, int8, int4, bf16 or fp16, or a list timing
  // each beyond the first as a column of its own (dtrain-int8); rounded rows are not checked.
  std::string wire = "exact";
  double timeout_s = 60;      // per operation, every implementation
  double deadline_s = 600;    // per implementation run, enforced by the driver
  bool jsonl = false;         // rank 0 prints result lines instead of the table (driver's children)
  std::string calibrate;      // measure the links first and write them here (docs/scaling.md)
  std::string netns;          // run every implementation on this emulated cluster (netns-hosts.sh)
  bool model = false;         // rank 0 prints the cost model's time beside each measured one
  bool bound = false;         // measure the machine's limits first; each row's fraction of them
  std::string machine_bound;  // the driver's measurement (machine_bound.h JSON), for its ranks
};

// What the arguments mean once parsed and checked.
struct Plan {
  std::vector<bench::Collective> collectives;
  std::vector<size_t> sizes;
  bench::ElemType dtype = bench::ElemType::kF32;
  bench::Op op = bench::Op::kSum;
  std::vector<std::string> peers;  // each a name of bench_peers.h's table, once
  double straggle_ms = 0;
  std::vector<std::string>
      wires;  // --wire's list: "exact", "int8", "int4", "bf16", "fp16"; at least one
};

// Throws InvalidArgumentError naming the flag that is wrong and what it accepts.
Plan make_plan(const BenchArgs& a);

// The collective of the algorithm registry a benchmarked one is (none for send/recv).
std::optional<comm::CollectiveKind> kind_of(bench::Collective c);

}  // namespace dtrain::tools
