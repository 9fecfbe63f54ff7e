// Rank mode of `dtrain bench`: what one rank of dtrain measures, and --calibrate's fit of the
// cost model's constants to this group's links.
#include "tools/dtrain/bench_rank.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "bench/bench_common.h"
#include "bench/machine_bound.h"
#include "comm/algorithms/algorithm.h"
#include "comm/cost_model.h"
#include "comm/native_process_group.h"
#include "common/durable.h"
#include "dtrain/error.h"
#include "dtrain/identity.h"
#include "dtrain/process_group.h"
#include "tools/dtrain/bench_report.h"

namespace dtrain::tools {
namespace {

using bench::Collective;
using bench::ElemType;
using bench::Op;
using bench::Result;

DType to_dtype(ElemType t) {
  switch (t) {
    case ElemType::kF32:
      return DType::kF32;
    case ElemType::kF64:
      return DType::kF64;
    case ElemType::kI32:
      return DType::kI32;
    case ElemType::kI64:
      return DType::kI64;
  }
  return DType::kU8;
}

ReduceOp to_reduce_op(Op op) {
  switch (op) {
    case Op::kSum:
      return ReduceOp::kSum;
    case Op::kProd:
      return ReduceOp::kProd;
    case Op::kMin:
      return ReduceOp::kMin;
    case Op::kMax:
      return ReduceOp::kMax;
  }
  return ReduceOp::kSum;
}

double reduce_scalar(ProcessGroup& pg, double v, ReduceOp op, std::chrono::milliseconds timeout) {
  AllreduceOptions o;
  o.op = op;
  o.timeout = timeout;
  o.async_op = false;
  pg.allreduce(TensorView{&v, 1, DType::kF64}, o)->wait();
  return v;
}

Result run_native_size(ProcessGroup& pg, const BenchArgs& a, const Plan& p, Collective c,
                       size_t bytes) {
  const int rank = pg.rank();
  const int n = pg.size();
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000));
  const bench::Layout layout = bench::layout_for(c, bytes, n, p.dtype);
  const bool in_place =
      c == Collective::kAllreduce || c == Collective::kBroadcast || c == Collective::kReduce;
  bench::Buffers buffers(c, p.dtype, p.op, rank, n, layout, in_place);
  const DType dt = to_dtype(p.dtype);
  const TensorView in{buffers.input(), layout.in_count, dt};
  const TensorView out{buffers.output(), in_place ? layout.in_count : layout.out_count, dt};
  const ReduceOp op = to_reduce_op(p.op);

  bench::Hooks h;
  h.prepare = [&buffers] { buffers.restore(false); };
  h.prepare_check = [&buffers] { buffers.restore(true); };
  h.barrier = [&pg, timeout] {
    BarrierOptions o;
    o.timeout = timeout;
    o.async_op = false;
    pg.barrier(o)->wait();
  };
  h.max_over_ranks = [&pg, timeout](double v) {
    return reduce_scalar(pg, v, ReduceOp::kMax, timeout);
  };
  h.sum_over_ranks = [&pg, timeout](double v) {
    return reduce_scalar(pg, v, ReduceOp::kSum, timeout);
  };
  if (a.check)
    h.check = [&, c] {
      return bench::count_wrong(c, p.dtype, p.op, rank, n, layout, buffers.output());
    };
  h.straggle_seconds = a.straggle_ms / 1000.0;
  h.straggler = rank == n - 1;

  ProcessGroup* g = &pg;
  const std::string algo = a.algo;
  switch (c) {
    case Collective::kAllreduce:
      if (a.wire != "exact") {
        // Rounded, so not checked against the exact sum (tests/comm/quantized_allreduce_test.cc
        // bounds its error).
        h.check = nullptr;
        const Wire wire = parse_wire(a.wire);
        h.run = [=] {
          AllreduceOptions o{op, timeout, algo, false};
          o.wire = wire;
          g->allreduce(in, o)->wait();
        };
        break;
      }
      h.run = [=] { g->allreduce(in, AllreduceOptions{op, timeout, algo, false})->wait(); };
      break;
    case Collective::kBroadcast:
      h.run = [=] { g->broadcast(in, BroadcastOptions{0, timeout, algo, false})->wait(); };
      break;
    case Collective::kReduce:
      h.run = [=] { g->reduce(in, ReduceOptions{0, op, timeout, algo, false})->wait(); };
      break;
    case Collective::kAllgather:
      h.run = [=] { g->allgather(out, in, AllgatherOptions{timeout, algo, false})->wait(); };
      break;
    case Collective::kGather:
      h.run = [=] { g->gather(out, in, GatherOptions{0, timeout, false})->wait(); };
      break;
    case Collective::kScatter:
      h.run = [=] { g->scatter(out, in, ScatterOptions{0, timeout, false})->wait(); };
      break;
    case Collective::kReduceScatter:
      h.run = [=] {
        g->reduce_scatter(out, in, ReduceScatterOptions{op, timeout, algo, false})->wait();
      };
      break;
    case Collective::kAlltoall:
      h.run = [=] { g->alltoall(out, in, AlltoallOptions{timeout, false})->wait(); };
      break;
    case Collective::kBarrier:
      h.run = [=] { g->barrier(BarrierOptions{timeout, algo, false})->wait(); };
      break;
    case Collective::kSendRecv: {
      if (n < 2) throw InvalidArgumentError("dtrain bench sendrecv needs --np 2 or more");
      const int next = (rank + 1) % n;
      const int prev = (rank + n - 1) % n;
      h.run = [=] {
        auto r = g->irecv(out, prev, 0, RecvOptions{timeout});
        auto s = g->isend(in, next, 0, SendOptions{timeout});
        s->wait();
        r->wait();
      };
      break;
    }
  }
  bench::Measurement m = bench::measure(h, a.warmup, a.iters);
  // The algorithm the cost model (or --algo, or DTRAIN_ALGO) picked for this size.
  std::string chosen = algo.empty() ? "auto" : algo;
  if (auto* native = dynamic_cast<comm::NativeProcessGroup*>(g))
    if (auto kind = kind_of(c)) chosen = native->algorithm_for(*kind, algo, in.nbytes());
  if (a.wire != "exact") chosen = a.wire;
  return bench::make_result("dtrain", c, n, layout, p.dtype, p.op, m, chosen);
}

// --calibrate: measures the links, fits the per-message and per-call costs on the collective
// path, sets them on this group and has rank 0 write them to `file`.
void calibrate(ProcessGroup& pg, comm::NativeProcessGroup& native, const std::string& file) {
  auto k = native.measure_links(native.cost_model().constants());
  // A step of a collective is not a ping-pong through send/recv: fit the per-message cost of
  // the slowest link the group crosses, and what a collective call costs beyond its messages,
  // to two tiny all-reduces timed on the collective path, recursive doubling (log2 p steps)
  // and a ring (2(N-1) steps). Rank 0's figures for everyone; where the fit makes no sense
  // (noise, p = 2(N-1)), the ping-pong's alpha stays.
  std::vector<double> tiny(1);
  auto time_tiny = [&](const char* algo) {
    for (int i = 0; i < 10; ++i) pg.allreduce(TensorView::of(tiny), {.algorithm = algo})->wait();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 200; ++i) pg.allreduce(TensorView::of(tiny), {.algorithm = algo})->wait();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 200;
  };
  const int n = pg.size();
  const double steps_rd = std::log2(static_cast<double>(std::bit_floor(static_cast<unsigned>(n)))) +
                          (std::has_single_bit(static_cast<unsigned>(n)) ? 0 : 2);
  const double steps_ring = 2.0 * (n - 1);
  std::vector<double> fit{time_tiny("recursive_doubling"), time_tiny("ring")};
  pg.broadcast(TensorView::of(fit), {.root = 0})->wait();
  const auto& t = native.topology();
  double& alpha = t.local ? k.alpha_local : t.spans_racks ? k.alpha_rack : k.alpha;
  if (n > 1 && steps_ring > steps_rd) {
    const double fitted = (fit[1] - fit[0]) / (steps_ring - steps_rd);
    if (fitted > 0 && fitted < 10 * alpha) alpha = fitted;
  }
  k.call = std::max(1e-6, fit[0] - steps_rd * alpha);
  native.set_cost_constants(k);
  if (pg.rank() != 0) return;
  // A file a job reads at start-up: written whole or not at all.
  const std::string tmp = file + ".tmp";
  durable::write_file(
      tmp, comm::CostModel::to_json(k, fmt::format("dtrain bench --calibrate, {} ranks; {}",
                                                   pg.size(), native.hierarchy())));
  std::filesystem::rename(tmp, file);
  const auto dir = std::filesystem::path(file).parent_path().string();
  durable::fsync_dir(dir.empty() ? "." : dir);
  std::printf("calibration written to %s:\n%s", file.c_str(),
              comm::CostModel::to_json(k, "").c_str());
}

// --bound: the time the machine's own limits allow `algo` at `bytes` on this group: the cost
// model's formula for it (its messages, copies and reductions) at the machine's rates instead of
// the calibrated ones, and nothing for the call itself. A message through shared memory is a
// cache line crossing once; a message over TCP half a socket's round trip, then the loopback
// stream, at most the group's share of all that the machine's CPUs carry through TCP at once (a
// stream per CPU: every flow's bytes are copied by the kernel on the same CPUs). A copy or a
// reduction streams at this rank's share of what the CPUs copy: from their own caches while the
// group's working set stays in the last level (the cost model's rule for when the rings spill,
// cost_model.cc), through memory beyond it; the reductions of an algorithm that reduces chunks
// in cache (the direct forms, which copy each byte through memory once) at the cached rate.
double bound_seconds(const bench::MachineBound& b, const comm::NativeProcessGroup& g,
                     const std::string& algo, comm::CollectiveKind kind, size_t bytes) {
  comm::CostConstants k = g.cost_model().constants();
  const int n = g.size();
  const bool cached = 4.0 * n * static_cast<double>(bytes) < k.cache_bytes;
  const double in_cache = b.memcpy_cached_gbs * std::min(1.0, static_cast<double>(b.copiers) / n);
  const double copy = (cached ? in_cache : std::min(b.memcpy_gbs, b.memcpy_all_gbs / n)) * 1e9;
  const comm::algo::Algorithm* a = comm::algo::find(kind, algo);
  k.alpha_local = b.cache_line_round_trip_ns * 0.5e-9;
  k.beta_local = 1.0 / copy;
  k.gamma = a != nullptr && a->reduces_in_cache ? 1.0 / (in_cache * 1e9) : 1.0 / copy;
  k.alpha = b.socket_round_trip_us * 0.5e-6;
  k.beta = 1.0 / (b.tcp_stream_gbs * 1e9);
  k.alpha_rack = k.beta_rack = 0;
  k.beta_machine = 1.0 / (b.tcp_all_gbs * 1e9);
  k.beta_machine_shm = 0;
  k.call = 0;
  return comm::CostModel(k).cost(algo, kind, bytes, n, g.topology());
}

// The machine's bound for this run: the driver's, or (under `dtrain run`) rank 0's own,
// measured before the group exists so that no other rank shares the machine meanwhile.
std::optional<bench::MachineBound> machine_bound(const BenchArgs& a) {
  if (!a.machine_bound.empty()) {
    try {
      return bench::parse_machine_bound(a.machine_bound);
    } catch (const std::invalid_argument& e) {
      throw InvalidArgumentError(fmt::format("dtrain bench --machine-bound: {}", e.what()));
    }
  }
  if (!a.bound || resolve_identity().rank != 0) return std::nullopt;
  return bench::measure_machine_bound();
}

}  // namespace

int run_rank(const BenchArgs& a) {
  const Plan p = make_plan(a);
  if (a.rounds != 1)
    throw InvalidArgumentError(fmt::format(
        "dtrain bench: --rounds {} is for the driver, which starts the ranks itself; under "
        "`dtrain run` or mpirun, run the job again instead",
        a.rounds));
  InitOptions init;
  init.group.timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000));
  init.group.backend = a.backend;
  init.group.transport = a.transport;
  const auto bound = machine_bound(a);
  auto pg = init_process_group(init);
  auto* native = dynamic_cast<comm::NativeProcessGroup*>(pg.get());
  if (!a.calibrate.empty()) {
    if (!native)
      throw InvalidArgumentError(
          "dtrain bench --calibrate measures the native backend's links: drop --backend");
    calibrate(*pg, *native, a.calibrate);
  }
  std::vector<Result> results;
  std::vector<std::string> model_lines;
  for (Collective c : p.collectives) {
    const std::vector<size_t> sizes = c == Collective::kBarrier ? std::vector<size_t>{0} : p.sizes;
    for (size_t bytes : sizes) {
      Result r = run_native_size(*pg, a, p, c, bytes);
      if (pg->rank() != 0) continue;
      if (bound && native && kind_of(c) && r.time_us > 0)
        r.bound_fraction =
            bound_seconds(*bound, *native, r.algo, *kind_of(c), bytes) * 1e6 / r.time_us;
      if (a.model && native && c == Collective::kAllreduce) {
        const double predicted = native->cost_model().cost(r.algo, comm::CollectiveKind::kAllreduce,
                                                           bytes, pg->size(), native->topology());
        model_lines.push_back(fmt::format("{:>10} {:>20} {:>12.1f} {:>12.1f} {:>8.2f}", bytes,
                                          r.algo, r.time_us, predicted * 1e6,
                                          predicted * 1e6 / r.time_us));
      }
      if (a.jsonl) {
        std::printf("%s\n", bench::to_json_line(r).c_str());
        std::fflush(stdout);
      }
      results.push_back(std::move(r));
    }
  }
  if (pg->rank() == 0 && !a.jsonl) {
    print_tables(p, results, {}, 1, stdout);
    if (!a.json_file.empty()) write_json(a.json_file, results);
  }
  if (pg->rank() == 0 && !model_lines.empty()) {
    std::printf(
        "the cost model beside the measurement (all_reduce, %d ranks, %s):\n%10s %20s %12s %12s "
        "%8s\n",
        pg->size(), native->hierarchy().c_str(), "bytes", "algorithm", "measured_us", "model_us",
        "ratio");
    for (const auto& l : model_lines) std::printf("%s\n", l.c_str());
  }
  for (const auto& r : results)
    if (r.wrong > 0) return 1;
  return 0;
}

}  // namespace dtrain::tools
