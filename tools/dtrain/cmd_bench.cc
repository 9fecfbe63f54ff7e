// `dtrain bench COLL --np N [--sizes 4K,64K,1M] [--peers gloo,mpi,mpi-tcp,torch] ...`: times a
// collective nccl-tests style, dtrain and other implementations side by side in one run.
//
// This file is the command line: under `dtrain run` or `mpirun` (RANK or OMPI_COMM_WORLD_RANK
// set) it is one rank of that job and measures dtrain only (bench_rank.h); otherwise it is the
// driver (bench_driver.h), which starts dtrain's ranks and each peer's (bench_peers.h) and prints
// one table per collective (bench_report.h). `--backend native,gloo` compares dtrain's own
// backends the same way (columns dtrain-gloo, ...). bench/bench_common.h holds the timing loop,
// the checks and the result format every implementation shares; docs/performance.md describes
// the method.
#include <memory>

#include "common/env.h"
#include "tools/dtrain/bench_driver.h"
#include "tools/dtrain/bench_peers.h"
#include "tools/dtrain/bench_plan.h"
#include "tools/dtrain/bench_rank.h"
#include "tools/dtrain/commands.h"

namespace dtrain::tools {
namespace {

bool is_rank_of_a_job() {
  return env::raw(env::kRank).has_value() || env::raw(env::kOmpiRank).has_value();
}

}  // namespace

CLI::App* add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand(
      "bench",
      "Time collectives nccl-tests style: dtrain and its peers (gloo, mpi, torch) side by side");
  cmd->footer(
      "COLL: allreduce, broadcast, reduce, allgather, gather, scatter, reducescatter, alltoall,\n"
      "barrier, sendrecv, a comma-separated list of them, or all. Sizes are each rank's buffer as\n"
      "nccl-tests count them. Under `dtrain run` or `mpirun` it is one rank of that job and "
      "measures\n"
      "dtrain only. Method and bus bandwidth factors: `dtrain docs performance`.");
  cmd->add_option("coll", a->collectives, "Collective(s) to time")->required();
  cmd->add_option("--np", a->np, "Ranks to start (driver mode)")->capture_default_str();
  cmd->add_option("--sizes", a->sizes,
                  "Per-rank buffer sizes: 4K,64K,1M or a doubling range 4K:64M")
      ->capture_default_str();
  cmd->add_option("--dtype", a->dtype, "f32, f64, i32 or i64")->capture_default_str();
  cmd->add_option("--op", a->op, "sum, prod, min or max (reductions)")->capture_default_str();
  cmd->add_option("--iters", a->iters, "Timed iterations per size")->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "Untimed iterations first")->capture_default_str();
  cmd->add_option("--rounds", a->rounds,
                  "Run dtrain and every peer this many times, alternating; show the medians and "
                  "each ratio's median and range over the rounds (a noisy machine)")
      ->capture_default_str();
  cmd->add_flag("--check,!--no-check", a->check, "Verify the results (default on)");
  cmd->add_option("--json", a->json_file, "Also write every result as one JSON object per line");
  cmd->add_option("--peers", a->peers,
                  "Also time these: " + peer_names(", ") + " (comma-separated)");
  cmd->add_option("--straggle-ms", a->straggle_ms,
                  "The last rank arrives this late at every timed op; adds the CPU (user+sys, us) "
                  "the waiting ranks burn per op");
  cmd->add_option("--transport", a->transport, "dtrain's transport: tcp, shm or auto")
      ->capture_default_str();
  cmd->add_option("--bind", a->bind,
                  "dtrain's ranks: auto binds each to its own share of the CPUs when there are no "
                  "more ranks than CPUs (as `dtrain run` and mpirun do); none leaves them unbound")
      ->check(CLI::IsMember({"auto", "none"}))
      ->capture_default_str();
  cmd->add_option("--backend", a->backend,
                  "Backend of dtrain's group: native, gloo, nccl (driver mode) or mpi (run under "
                  "mpirun); a list (native,gloo) times each and shows the others as columns");
  cmd->add_option("--algo", a->algo,
                  "dtrain's algorithm (default: the cost model's choice); 'all': each algorithm of "
                  "the collective that can run here, beside the model's choice");
  cmd->add_option(
         "--wire", a->wire,
         "all_reduce's values on the wire: exact, int8 (one byte a value and a scale per "
         "256, f32 sum), int4, bf16, fp16, or a list (exact,bf16,int8) that times each as a "
         "column")
      ->capture_default_str();
  cmd->add_option("--timeout", a->timeout_s,
                  "Seconds each operation may take, every implementation")
      ->capture_default_str();
  cmd->add_option("--deadline", a->deadline_s,
                  "Seconds each implementation's whole run may take before it is killed")
      ->capture_default_str();
  cmd->add_option("--netns", a->netns,
                  "Run every implementation's ranks on the emulated cluster NAME that "
                  "scripts/netns-hosts.sh made, in blocks of consecutive ranks per host (`dtrain "
                  "docs scaling`)");
  cmd->add_option(
      "--calibrate", a->calibrate,
      "Under dtrain run: measure the links first (ping-pong per class of link) and write "
      "the cost model's file here, for DTRAIN_COST_FILE (`dtrain docs scaling`)");
  cmd->add_flag(
      "--model", a->model,
      "Under dtrain run: print the cost model's all-reduce time beside each measured one");
  cmd->add_flag("--bound", a->bound,
                "Measure first what this machine allows (memcpy with one and every CPU, a "
                "loopback TCP stream, a socket's and a cache line's round trip) and show each "
                "dtrain row's fraction of it: the time its algorithm's messages and copies take "
                "at those rates over the time measured (`dtrain docs performance`)");
  cmd->add_option("--machine-bound", a->machine_bound,
                  "The driver's --bound measurement, for its ranks")
      ->group("");
  cmd->add_flag("--jsonl", a->jsonl,
                "Rank 0 prints result lines, not the table (the driver's ranks)")
      ->group("");
  cmd->callback([a] {
    int rc = is_rank_of_a_job() ? run_rank(*a) : run_driver(*a);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
  return cmd;
}

}  // namespace dtrain::tools
