// `dtrain bench COLL --np N [--sizes 4K,64K,1M] [--peers gloo,mpi,mpi-tcp,torch] ...`: times a
// collective nccl-tests style, dtrain and other implementations side by side in one run.
//
// As a driver (no RANK or OMPI_COMM_WORLD_RANK in the environment) it starts N ranks of itself
// against a store it hosts, then each requested peer (build/bin/gloo_peer, mpi_peer under mpirun,
// bench/peers/torch_peer.py), collects the JSON result line each prints from rank 0, and prints
// one table per collective. Each implementation's processes run under the launcher's supervisor
// (launch/supervisor.h, as under `dtrain run`) and a deadline; one that overruns is stopped.
// `--backend native,gloo` compares dtrain's own backends the same way (columns dtrain-gloo, ...).
// Under `dtrain run` or `mpirun` (RANK or OMPI_COMM_WORLD_RANK set) it is one rank of that job and
// measures dtrain only. bench/bench_common.h holds the timing loop, the checks and the result
// format every implementation shares; docs/performance.md describes the method.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "bench/bench_common.h"
#include "comm/algorithms/algorithm.h"
#include "comm/native_process_group.h"
#include "common/durable.h"
#include "common/env.h"
#include "common/socket.h"
#include "dtrain/error.h"
#include "dtrain/process_group.h"
#include "dtrain/store.h"
#include "launch/cpu_binding.h"
#include "launch/supervisor.h"
#include "tools/dtrain/commands.h"

namespace dtrain::tools {
namespace {

namespace fs = std::filesystem;
using bench::Collective;
using bench::ElemType;
using bench::Op;
using bench::Result;

constexpr const char* kDefaultSizes = "4K,64K,1M,16M,64M";
// The interpreter of the environment dtrain was built for (it holds torch): the torch peer's.
#ifdef DTRAIN_PYTHON_EXECUTABLE
constexpr const char* kPythonPath = DTRAIN_PYTHON_EXECUTABLE;
#else
constexpr const char* kPythonPath = "/usr/bin/python3";
#endif
constexpr std::chrono::milliseconds kKillGrace{2000};

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
  double timeout_s = 60;    // per operation, every implementation
  double deadline_s = 600;  // per implementation run, enforced by the driver
  bool jsonl = false;       // rank 0 prints result lines instead of the table (driver's children)
  std::string calibrate;    // measure the links first and write them here (docs/scaling.md)
  std::string netns;        // run every implementation on this emulated cluster (netns-hosts.sh)
  bool model = false;       // rank 0 prints the cost model's time beside each measured one
};

// The collective of the algorithm registry a benchmarked one is (none for send/recv).
std::optional<comm::CollectiveKind> kind_of(Collective c) {
  switch (c) {
    case Collective::kAllreduce:
      return comm::CollectiveKind::kAllreduce;
    case Collective::kBroadcast:
      return comm::CollectiveKind::kBroadcast;
    case Collective::kReduce:
      return comm::CollectiveKind::kReduce;
    case Collective::kAllgather:
      return comm::CollectiveKind::kAllgather;
    case Collective::kGather:
      return comm::CollectiveKind::kGather;
    case Collective::kScatter:
      return comm::CollectiveKind::kScatter;
    case Collective::kReduceScatter:
      return comm::CollectiveKind::kReduceScatter;
    case Collective::kAlltoall:
      return comm::CollectiveKind::kAlltoall;
    case Collective::kBarrier:
      return comm::CollectiveKind::kBarrier;
    case Collective::kSendRecv:
      return std::nullopt;
  }
  return std::nullopt;
}

// What the arguments mean once parsed and checked.
struct Plan {
  std::vector<Collective> collectives;
  std::vector<size_t> sizes;
  ElemType dtype = ElemType::kF32;
  Op op = Op::kSum;
  std::vector<std::string> peers;
  double straggle_ms = 0;
};

Plan make_plan(const BenchArgs& a) {
  Plan p;
  p.straggle_ms = a.straggle_ms;
  if (a.straggle_ms < 0)
    throw InvalidArgumentError("dtrain bench: --straggle-ms cannot be negative");
  try {
    if (a.collectives == "all") {
      p.collectives = bench::all_collectives();
    } else {
      size_t pos = 0;
      while (pos <= a.collectives.size()) {
        size_t comma = a.collectives.find(',', pos);
        std::string item =
            a.collectives.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        if (!item.empty()) p.collectives.push_back(bench::parse_collective(item));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    }
    p.sizes = bench::parse_sizes(a.sizes);
    p.dtype = bench::parse_elem_type(a.dtype);
    p.op = bench::parse_op(a.op);
  } catch (const std::invalid_argument& e) {
    throw InvalidArgumentError(fmt::format("dtrain bench: {}", e.what()));
  }
  if (p.collectives.empty())
    throw InvalidArgumentError(
        "dtrain bench: name a collective, e.g. dtrain bench allreduce --np 4");
  if (a.iters < 1 || a.warmup < 0)
    throw InvalidArgumentError(fmt::format(
        "dtrain bench: --iters {} --warmup {}: time at least one iteration, warm up zero or more",
        a.iters, a.warmup));
  if (a.rounds < 1)
    throw InvalidArgumentError(
        fmt::format("dtrain bench: --rounds {}: run at least one round", a.rounds));
  if (a.timeout_s <= 0 || a.deadline_s <= 0)
    throw InvalidArgumentError("dtrain bench: --timeout and --deadline must be positive seconds");
  env::seconds("dtrain bench: --timeout", a.timeout_s);  // finite, at most a year
  env::seconds("dtrain bench: --deadline", a.deadline_s);
  if (a.transport != "auto" && a.transport != "tcp" && a.transport != "shm")
    throw InvalidArgumentError(fmt::format(
        "dtrain bench: --transport {}: use tcp, shm or auto (shared memory between ranks of one "
        "host, TCP between hosts)",
        a.transport));
  size_t pos = 0;
  while (!a.peers.empty() && pos <= a.peers.size()) {
    size_t comma = a.peers.find(',', pos);
    std::string item =
        a.peers.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!item.empty()) {
      if (item != "gloo" && item != "mpi" && item != "mpi-tcp" && item != "torch")
        throw InvalidArgumentError(
            fmt::format("dtrain bench: unknown peer '{}': use gloo, mpi, mpi-tcp or torch", item));
      if (std::find(p.peers.begin(), p.peers.end(), item) == p.peers.end()) p.peers.push_back(item);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return p;
}

// ---------------------------------------------------------------------------------------------
// Rank mode: one rank of dtrain's side.

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
  return bench::make_result("dtrain", c, n, layout, p.dtype, p.op, m, chosen);
}

void print_tables(const Plan& p, const std::vector<Result>& results,
                  const std::vector<std::string>& peers, int rounds, std::FILE* out);
void write_json(const std::string& path, const std::vector<Result>& results);

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
  auto pg = init_process_group(init);
  auto* native = dynamic_cast<comm::NativeProcessGroup*>(pg.get());
  if (!a.calibrate.empty()) {
    if (!native)
      throw InvalidArgumentError(
          "dtrain bench --calibrate measures the native backend's links: drop --backend");
    auto k = native->measure_links(native->cost_model().constants());
    // A step of a collective is not a ping-pong through send/recv: fit the per-message cost of
    // the slowest link the group crosses, and what a collective call costs beyond its messages,
    // to two tiny all-reduces timed on the collective path, recursive doubling (log2 p steps)
    // and a ring (2(N-1) steps). Rank 0's figures for everyone; where the fit makes no sense
    // (noise, p = 2(N-1)), the ping-pong's alpha stays.
    std::vector<double> tiny(1);
    auto time_tiny = [&](const char* algo) {
      for (int i = 0; i < 10; ++i) pg->allreduce(TensorView::of(tiny), {.algorithm = algo})->wait();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 200; ++i)
        pg->allreduce(TensorView::of(tiny), {.algorithm = algo})->wait();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 200;
    };
    const int n = pg->size();
    const double steps_rd =
        std::log2(static_cast<double>(std::bit_floor(static_cast<unsigned>(n)))) +
        (std::has_single_bit(static_cast<unsigned>(n)) ? 0 : 2);
    const double steps_ring = 2.0 * (n - 1);
    std::vector<double> fit{time_tiny("recursive_doubling"), time_tiny("ring")};
    pg->broadcast(TensorView::of(fit), {.root = 0})->wait();
    const auto& t = native->topology();
    double& alpha = t.local ? k.alpha_local : t.spans_racks ? k.alpha_rack : k.alpha;
    if (n > 1 && steps_ring > steps_rd) {
      const double fitted = (fit[1] - fit[0]) / (steps_ring - steps_rd);
      if (fitted > 0 && fitted < 10 * alpha) alpha = fitted;
    }
    k.call = std::max(1e-6, fit[0] - steps_rd * alpha);
    native->set_cost_constants(k);
    if (pg->rank() == 0) {
      // A file a job reads at start-up: written whole or not at all.
      const std::string tmp = a.calibrate + ".tmp";
      durable::write_file(
          tmp, comm::CostModel::to_json(k, fmt::format("dtrain bench --calibrate, {} ranks; {}",
                                                       pg->size(), native->hierarchy())));
      std::filesystem::rename(tmp, a.calibrate);
      const auto dir = std::filesystem::path(a.calibrate).parent_path().string();
      durable::fsync_dir(dir.empty() ? "." : dir);
      std::printf("calibration written to %s:\n%s", a.calibrate.c_str(),
                  comm::CostModel::to_json(k, "").c_str());
    }
  }
  std::vector<Result> results;
  std::vector<std::string> model_lines;
  for (Collective c : p.collectives) {
    const std::vector<size_t> sizes = c == Collective::kBarrier ? std::vector<size_t>{0} : p.sizes;
    for (size_t bytes : sizes) {
      Result r = run_native_size(*pg, a, p, c, bytes);
      if (pg->rank() != 0) continue;
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

// ---------------------------------------------------------------------------------------------
// Driver: start each implementation's ranks, bounded by a deadline, and collect their results.

struct ChildSpec {
  std::string label;  // "rank 3", "mpirun"
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;  // on top of ours
  std::vector<int> cpus;  // sched_setaffinity before exec; empty = the driver's
  std::string netns;      // the network namespace to run in ("" = the driver's)
};

// The emulated cluster of `--netns NAME`, as scripts/netns-hosts.sh recorded it: hosts
// NAME-h0.. at SUBNET.1.., this machine at SUBNET.254. Ranks go to the hosts in blocks, as a
// launcher fills nodes.
struct EmulatedCluster {
  std::string name;
  std::string subnet;
  int hosts = 0;
  std::string head() const { return subnet + ".254"; }
  std::string address(int host) const { return fmt::format("{}.{}", subnet, host + 1); }
  int host_of(int rank, int np) const { return rank * std::min(hosts, np) / np; }
  std::string netns(int host) const { return fmt::format("{}-h{}", name, host); }
  int first_rank(int host, int np) const {
    int r = 0;
    while (r < np && host_of(r, np) < host) ++r;
    return r;
  }
  int ranks_on(int host, int np) const {
    int n = 0;
    for (int r = 0; r < np; ++r) n += host_of(r, np) == host;
    return n;
  }
};

std::optional<EmulatedCluster> read_cluster(const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (::geteuid() != 0)
    throw InvalidArgumentError(fmt::format(
        "dtrain bench --netns {}: entering the cluster's network namespaces needs root: run it "
        "with sudo",
        name));
  const std::string path = "/run/dtrain-netns/" + name;
  std::ifstream f(path);
  if (!f)
    throw InvalidArgumentError(fmt::format(
        "dtrain bench --netns {}: no emulated cluster of that name ({} is missing): make it with "
        "scripts/netns-hosts.sh up {} HOSTS SUBNET",
        name, path, name));
  EmulatedCluster c;
  c.name = name;
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("n=", 0) == 0) c.hosts = std::stoi(line.substr(2));
    if (line.rfind("subnet=", 0) == 0) c.subnet = line.substr(7);
  }
  if (c.hosts < 1 || c.subnet.empty())
    throw InvalidArgumentError(
        fmt::format("dtrain bench --netns {}: {} does not say n= and subnet=", name, path));
  return c;
}

struct Outcome {
  std::vector<Result> results;
  std::string failure;  // empty when every process exited 0
};

// Starts the processes of one implementation with the launcher's supervisor (the same fork,
// output relay, failure handling and stop as `dtrain run`), bounded by --deadline, and takes
// the result lines ('{...}') they print on stdout; the rest of their output goes to stderr.
Outcome run_children(launch::Supervisor& supervisor, const std::string& impl,
                     const std::vector<ChildSpec>& specs, const BenchArgs& a) {
  Outcome o;
  launch::SupervisorOptions so;
  so.name = "dtrain bench";
  so.command = specs.at(0).argv;
  for (size_t i = 0; i < specs.size(); ++i) {
    const ChildSpec& c = specs[i];
    launch::WorkerSpec w;
    w.rank = static_cast<int>(i);
    w.env = c.env;
    w.command = c.argv;
    w.label = fmt::format("{} {}", impl, c.label);
    w.cpus = c.cpus;
    w.netns = c.netns;
    so.workers.push_back(std::move(w));
  }
  so.grace_period = kKillGrace;
  so.stdout_fd = STDERR_FILENO;  // the driver's stdout holds the tables only
  so.report_failure = false;
  so.take_stdout_line = [&](int, std::string_view line) {
    if (line.empty() || line.front() != '{') return false;
    try {
      o.results.push_back(bench::parse_json_line(std::string(line)));
      return true;
    } catch (const std::invalid_argument&) {
      return false;
    }
  };
  // The deadline: a timer the supervisor watches as its stop descriptor.
  net::Fd timer(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC));
  if (!timer.valid())
    throw InternalError(fmt::format("dtrain bench: timerfd_create: {}", std::strerror(errno)));
  const auto limit = std::chrono::nanoseconds(static_cast<int64_t>(a.deadline_s * 1e9));
  itimerspec at{};
  at.it_value.tv_sec = static_cast<time_t>(limit.count() / 1'000'000'000);
  at.it_value.tv_nsec = static_cast<long>(limit.count() % 1'000'000'000);
  if (at.it_value.tv_sec == 0 && at.it_value.tv_nsec == 0) at.it_value.tv_nsec = 1;
  ::timerfd_settime(timer.get(), 0, &at, nullptr);
  so.stop_fds = {timer.get()};
  const launch::SupervisorResult r = supervisor.supervise(so);
  using Ended = launch::SupervisorResult::Outcome;
  switch (r.outcome) {
    case Ended::kSucceeded:
      break;
    case Ended::kFailed:
      o.failure = fmt::format("{}: {} {} (its error is above); stopped the others", impl,
                              specs.at(r.first_failure->rank).label, r.first_failure->how());
      break;
    case Ended::kStopped:
      o.failure = fmt::format(
          "{}: did not finish within the deadline ({:g} s, --deadline); "
          "stopped",
          impl, a.deadline_s);
      break;
    case Ended::kInterrupted:
      o.failure = fmt::format("{}: interrupted by {}", impl, launch::signal_name(r.interrupted_by));
      break;
    case Ended::kRequeued:
      o.failure = fmt::format("{}: exited for a requeue (code {})", impl, r.exit_code);
      break;
  }
  return o;
}

// A TCP port free right now on 127.0.0.1 (for torch's own store; the tiny race with another
// process taking it meanwhile shows up as that peer failing, named).
uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw InternalError(fmt::format("dtrain bench: socket: {}", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int err = errno;
    ::close(fd);
    throw InternalError(
        fmt::format("dtrain bench: cannot find a free port: {}", std::strerror(err)));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::vector<std::pair<std::string, std::string>> rank_env(int rank, int np, uint16_t port) {
  return {{"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(np)},
          {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(np)},
          {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", std::to_string(port)},
          {"DTRAIN_AGENT_STORE", "1"}};
}

// On an emulated cluster: the rank's host (its namespace), its local rank there, and the store
// at `master` (the driver's, at the head address; torch's, on host 0).
void place(ChildSpec& s, const EmulatedCluster& c, int rank, int np, const std::string& master) {
  const int host = c.host_of(rank, np);
  s.netns = c.netns(host);
  for (auto& [k, v] : s.env) {
    if (k == "LOCAL_RANK") v = std::to_string(rank - c.first_rank(host, np));
    if (k == "LOCAL_WORLD_SIZE") v = std::to_string(c.ranks_on(host, np));
    if (k == "MASTER_ADDR") v = master;
  }
}

bench::PeerConfig peer_config(const BenchArgs& a, const Plan& p) {
  bench::PeerConfig c;
  c.collectives = p.collectives;
  c.sizes = p.sizes;
  c.dtype = p.dtype;
  c.op = p.op;
  c.iters = a.iters;
  c.warmup = a.warmup;
  c.check = a.check;
  c.timeout_s = a.timeout_s;
  c.straggle_ms = a.straggle_ms;
  return c;
}

fs::path self_exe() { return fs::read_symlink("/proc/self/exe"); }

Outcome run_dtrain(launch::Supervisor& supervisor, const BenchArgs& a, const Plan& p) {
  const auto cluster = read_cluster(a.netns);
  TcpStoreServerOptions so;
  so.host = cluster ? cluster->head() : "127.0.0.1";
  so.port = 0;
  TcpStoreServer store(so);
  std::string sizes;
  for (size_t s : p.sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(s);
  std::vector<ChildSpec> specs;
  for (int r = 0; r < a.np; ++r) {
    ChildSpec s;
    s.label = fmt::format("rank {}", r);
    s.argv = {self_exe().string(),
              "bench",
              a.collectives,
              "--np",
              std::to_string(a.np),
              "--sizes",
              sizes,
              "--dtype",
              a.dtype,
              "--op",
              a.op,
              "--iters",
              std::to_string(a.iters),
              "--warmup",
              std::to_string(a.warmup),
              a.check ? "--check" : "--no-check",
              "--transport",
              a.transport,
              "--timeout",
              fmt::format("{}", a.timeout_s),
              "--jsonl"};
    if (!a.backend.empty()) {
      s.argv.push_back("--backend");
      s.argv.push_back(a.backend);
    }
    if (a.straggle_ms > 0) {
      s.argv.push_back("--straggle-ms");
      s.argv.push_back(fmt::format("{}", a.straggle_ms));
    }
    if (!a.algo.empty()) {
      s.argv.push_back("--algo");
      s.argv.push_back(a.algo);
    }
    if (!a.calibrate.empty()) s.argv.insert(s.argv.end(), {"--calibrate", a.calibrate});
    if (a.model) s.argv.push_back("--model");
    s.env = rank_env(r, a.np, store.port());
    if (cluster) place(s, *cluster, r, a.np, cluster->head());
    if (a.bind == "auto") s.cpus = launch::cpu_share(r, a.np, launch::allowed_cpus());
    specs.push_back(std::move(s));
  }
  return run_children(supervisor, "dtrain", specs, a);
}

// Runs peer `name`, or returns nullopt after saying in one line why it is skipped.
std::optional<Outcome> run_peer(launch::Supervisor& supervisor, const std::string& name,
                                const BenchArgs& a, const Plan& p) {
  auto skip = [&](const std::string& why) -> std::optional<Outcome> {
    std::fprintf(stderr, "%s: skipped, %s\n", name.c_str(), why.c_str());
    return std::nullopt;
  };
  const fs::path bin_dir = self_exe().parent_path();
  const auto cluster = read_cluster(a.netns);
  std::vector<std::string> peer_args = bench::to_peer_args(peer_config(a, p));
  std::vector<ChildSpec> specs;
  std::unique_ptr<TcpStoreServer> store;

  if (name == "gloo") {
    fs::path exe = bin_dir / "gloo_peer";
    if (!fs::exists(exe))
      return skip(fmt::format("{} not built (install libgloo-dev and rebuild)", exe.string()));
    TcpStoreServerOptions so;
    so.host = cluster ? cluster->head() : "127.0.0.1";
    so.port = 0;
    store = std::make_unique<TcpStoreServer>(so);
    for (int r = 0; r < a.np; ++r) {
      ChildSpec s{fmt::format("rank {}", r), {exe.string()}, rank_env(r, a.np, store->port())};
      if (cluster) place(s, *cluster, r, a.np, cluster->head());
      s.argv.insert(s.argv.end(), peer_args.begin(), peer_args.end());
      specs.push_back(std::move(s));
    }
  } else if (name == "mpi" || name == "mpi-tcp") {
    fs::path exe = bin_dir / "mpi_peer";
    if (!fs::exists(exe))
      return skip(fmt::format("{} not built (install libopenmpi-dev and rebuild)", exe.string()));
    std::string mpirun;
    try {
      mpirun = launch::find_executable("mpirun");
    } catch (const Error&) {
      return skip("mpirun not found on PATH (install openmpi-bin)");
    }
    ChildSpec s;
    s.label = "mpirun";
    s.argv = {mpirun, "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(a.np)};
    if (name == "mpi-tcp")
      s.argv.insert(s.argv.end(), {"--mca", "btl", "tcp,self", "--mca", "pml", "ob1"});
    if (cluster) {
      // mpirun stays here and starts its daemons on the hosts through the script's remote shell
      // (ip netns exec); they and the ranks talk over the cluster's subnet.
      const fs::path script = fs::path(DTRAIN_BENCH_PEERS_DIR).parent_path().parent_path() /
                              "scripts" / "netns-hosts.sh";
      if (!fs::exists(script))
        return skip(
            fmt::format("{} not found (mpirun reaches the hosts through it)", script.string()));
      std::string hosts;
      for (int h = 0; h < std::min(cluster->hosts, a.np); ++h)
        hosts += fmt::format("{}{}:{}", hosts.empty() ? "" : ",", cluster->address(h),
                             cluster->ranks_on(h, a.np));
      const std::string net = cluster->subnet + ".0/24";
      // Every daemon would bind its first rank to core 0, and none sees that the "hosts" share
      // this machine's cores: without binding, and yielding when idle where the ranks outnumber
      // the cores (what mpirun does by itself for an oversubscribed single host).
      if (a.np > static_cast<int>(std::thread::hardware_concurrency()))
        s.argv.insert(s.argv.end(), {"--mca", "mpi_yield_when_idle", "1"});
      // A daemon shares its hardware topology with its ranks through a segment it maps at a
      // hole in its address space, and OpenMPI 4.1's hwloc crashes there now and then when
      // several daemons start on one machine: no sharing.
      s.argv.insert(s.argv.end(), {"--mca", "rtc_hwloc_vmhole", "none"});
      s.argv.insert(s.argv.end(), {"--bind-to", "none", "--host", hosts, "--mca", "plm_rsh_agent",
                                   script.string() + " rsh " + cluster->name, "--mca",
                                   "btl_tcp_if_include", net, "--mca", "oob_tcp_if_include", net});
    }
    s.argv.insert(s.argv.end(), {exe.string(), "--impl", name});
    s.argv.insert(s.argv.end(), peer_args.begin(), peer_args.end());
    specs.push_back(std::move(s));
  } else if (name == "torch") {
    fs::path script = fs::path(DTRAIN_BENCH_PEERS_DIR) / "torch_peer.py";
    if (!fs::exists(kPythonPath))
      return skip(fmt::format("{} not found (install python3)", kPythonPath));
    if (!fs::exists(script)) return skip(fmt::format("{} not found", script.string()));
    // Importing torch takes seconds; ask once, bounded, before starting N of them.
    BenchArgs probe_args = a;
    probe_args.deadline_s = 120;
    Outcome probe = run_children(
        supervisor, "torch",
        {ChildSpec{"import check", {kPythonPath, "-c", "import torch.distributed"}, {}}},
        probe_args);
    if (!probe.failure.empty())
      return skip(
          fmt::format("{} cannot import torch.distributed (install torch into that environment, "
                      "e.g. with scripts/install-deps.sh)",
                      kPythonPath));
    uint16_t port = free_port();
    for (int r = 0; r < a.np; ++r) {
      auto env = rank_env(r, a.np, port);
      env.emplace_back("OMP_NUM_THREADS", "1");
      // torch's gloo finds its address from the host name, which inside a namespace names
      // nothing reachable: the namespace's one interface instead.
      if (cluster) env.emplace_back("GLOO_SOCKET_IFNAME", "eth0");
      ChildSpec s{fmt::format("rank {}", r), {kPythonPath, script.string()}, env};
      if (cluster) place(s, *cluster, r, a.np, cluster->address(0));
      s.argv.insert(s.argv.end(), peer_args.begin(), peer_args.end());
      specs.push_back(std::move(s));
    }
  }
  return run_children(supervisor, name, specs, a);
}

std::string format_us(double us) {
  if (us <= 0) return "-";
  return us >= 1e5 ? fmt::format("{:.0f}", us) : fmt::format("{:.1f}", us);
}

// One implementation at one size over the rounds of a run (one entry without --rounds).
using RoundResults = std::map<int, const Result*>;  // round -> result

// The row shown for several rounds: each number the median of the rounds' (each already a
// median over the timed iterations), #wrong their sum.
Result combine(const RoundResults& rounds) {
  const Result& first = *rounds.begin()->second;
  Result c = first;
  std::vector<double> time, p99, cpu;
  int64_t wrong = -1;
  for (const auto& [round, r] : rounds) {
    time.push_back(r->time_us);
    p99.push_back(r->p99_us);
    if (r->wait_cpu_us >= 0) cpu.push_back(r->wait_cpu_us);
    if (r->wrong >= 0) wrong = std::max<int64_t>(wrong, 0) + r->wrong;
  }
  c.time_us = bench::median(time);
  c.p99_us = bench::median(p99);
  if (c.time_us > 0) {  // bandwidths scale with 1/time, by the factors of the first round
    c.algbw_gbs = first.algbw_gbs * first.time_us / c.time_us;
    c.busbw_gbs = first.busbw_gbs * first.time_us / c.time_us;
  }
  c.wrong = wrong;
  c.wait_cpu_us = cpu.empty() ? -1 : bench::median(cpu);
  c.round = 0;
  return c;
}

// theirs/ours of each round both ran: the median, the lowest and the highest.
struct Ratio {
  double median = 0, low = 0, high = 0;
  bool valid = false;
};
Ratio ratio_over_rounds(const RoundResults& ours, const RoundResults& theirs) {
  std::vector<double> v;
  for (const auto& [round, r] : ours) {
    auto it = theirs.find(round);
    if (it != theirs.end() && r->time_us > 0 && it->second->time_us > 0)
      v.push_back(it->second->time_us / r->time_us);
  }
  if (v.empty()) return {};
  return {bench::median(v), *std::min_element(v.begin(), v.end()),
          *std::max_element(v.begin(), v.end()), true};
}

void print_tables(const Plan& p, const std::vector<Result>& results,
                  const std::vector<std::string>& peers, int rounds, std::FILE* out) {
  const bool several = rounds > 1;
  for (Collective c : p.collectives) {
    const std::string coll(bench::to_string(c));
    std::map<std::string, std::map<size_t, RoundResults>> by_impl;  // impl -> bytes -> rounds
    std::set<size_t> sizes;
    int np = 0;
    for (const auto& r : results) {
      if (r.coll != coll) continue;
      by_impl[r.impl][r.bytes][r.round] = &r;
      sizes.insert(r.bytes);
      np = r.np;
    }
    if (sizes.empty()) {
      fmt::print(out, "# {}: no results\n\n", coll);
      continue;
    }
    fmt::print(
        out, "# {}  np {}  dtype {}  op {}  (time: median us over the slowest rank; p99 us{})\n",
        coll, np, bench::to_string(p.dtype),
        bench::is_reduction(c) ? bench::to_string(p.op) : "none",
        several ? fmt::format("; the median of {} rounds, each implementation once per round; "
                              "ratio: the median of the rounds' ratios [lowest-highest]",
                              rounds)
                : "");
    std::string header = fmt::format(
        "{:>12} {:>12} {:>5} {:>5} {:>11} {:>11} {:>8} {:>8} {:>7} {:>18}", "size(B)", "count",
        "type", "op", "time(us)", "p99(us)", "algbw", "busbw", "#wrong", "algo");
    if (several) header += fmt::format(" {:>17}", "rounds(us)");
    const bool cpu = p.straggle_ms > 0;
    if (cpu) header += fmt::format(" {:>11}", "cpu/op(us)");
    for (const auto& peer : peers) {
      header += fmt::format(" {:>14}", peer + ":ratio");
      if (several) header += fmt::format(" {:>11}", "[range]");
      header += fmt::format(" {:>11}", peer + "(us)");
      if (cpu) header += fmt::format(" {:>11}", peer + ":cpu");
    }
    fmt::print(out, "{}\n", header);
    auto cpu_text = [](const std::optional<Result>& x) {
      return x && x->wait_cpu_us >= 0 ? format_us(x->wait_cpu_us) : std::string("-");
    };
    const auto& ours = by_impl["dtrain"];
    for (size_t bytes : sizes) {
      std::optional<Result> r;
      if (ours.count(bytes)) r = combine(ours.at(bytes));
      std::optional<Result> any = r;
      for (const auto& peer : peers)
        if (!any && by_impl[peer].count(bytes)) any = combine(by_impl[peer].at(bytes));
      std::string line =
          fmt::format("{:>12} {:>12} {:>5} {:>5} ", bytes, any->count, any->dtype, any->op);
      if (r) {
        line += fmt::format("{:>11} {:>11} {:>8.3f} {:>8.3f} {:>7} {:>18}", format_us(r->time_us),
                            format_us(r->p99_us), r->algbw_gbs, r->busbw_gbs,
                            r->wrong < 0 ? std::string("-") : std::to_string(r->wrong), r->algo);
      } else {
        line += fmt::format("{:>11} {:>11} {:>8} {:>8} {:>7} {:>18}", "-", "-", "-", "-", "-", "-");
      }
      if (several) {
        std::string range = "-";
        if (r) {
          std::vector<double> t;
          for (const auto& [round, x] : ours.at(bytes)) t.push_back(x->time_us);
          range = format_us(*std::min_element(t.begin(), t.end())) + "-" +
                  format_us(*std::max_element(t.begin(), t.end()));
        }
        line += fmt::format(" {:>17}", range);
      }
      if (cpu) line += fmt::format(" {:>11}", cpu_text(r));
      for (const auto& peer : peers) {
        const auto& theirs = by_impl[peer];
        if (!theirs.count(bytes)) {
          line += fmt::format(" {:>14}", "-");
          if (several) line += fmt::format(" {:>11}", "-");
          line += fmt::format(" {:>11}", "-");
          if (cpu) line += fmt::format(" {:>11}", "-");
          continue;
        }
        const Result q = combine(theirs.at(bytes));
        const Ratio ratio = r ? ratio_over_rounds(ours.at(bytes), theirs.at(bytes)) : Ratio{};
        line += fmt::format(" {:>14}", ratio.valid ? fmt::format("{:.2f}", ratio.median) : "-");
        if (several)
          line += fmt::format(
              " {:>11}", ratio.valid ? fmt::format("[{:.2f}-{:.2f}]", ratio.low, ratio.high) : "-");
        std::string time = format_us(q.time_us);
        if (q.wrong > 0) time += "!";  // that peer's results were wrong
        line += fmt::format(" {:>11}", time);
        if (cpu) line += fmt::format(" {:>11}", cpu_text(q));
      }
      fmt::print(out, "{}\n", line);
    }
    fmt::print(out, "\n");
  }
  std::fflush(out);
}

void write_json(const std::string& path, const std::vector<Result>& results) {
  std::ofstream f(path, std::ios::trunc);
  if (!f) throw InvalidArgumentError(fmt::format("dtrain bench: cannot write --json {}", path));
  for (const auto& r : results) f << bench::to_json_line(r) << "\n";
  if (!f) throw InvalidArgumentError(fmt::format("dtrain bench: writing --json {} failed", path));
}

// "native,gloo" -> {"native", "gloo"}; "" -> {""} (DTRAIN_BACKEND's choice).
std::vector<std::string> split_backends(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  do {
    size_t comma = text.find(',', pos);
    std::string item =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
    pos = comma == std::string::npos ? std::string::npos : comma + 1;
  } while (pos != std::string::npos);
  return out;
}

// --algo all: every algorithm of the collective in the registry (comm/algorithms/algorithm.h)
// that can run on this cluster, each timed as a column "dtrain-NAME" beside the model's choice.
std::vector<std::string> all_algorithms(const BenchArgs& a, const Plan& p) {
  if (a.algo != "all") return {};
  if (p.collectives.size() != 1 || !kind_of(p.collectives[0]))
    throw InvalidArgumentError(
        "dtrain bench: --algo all times every algorithm of one collective: name exactly one "
        "(all_reduce, broadcast, reduce, all_gather, ...)");
  // The shape the ranks will see: one host, or the emulated cluster's blocks of ranks.
  comm::Topology t;
  t.can_read_all = a.netns.empty() && a.transport != "tcp";
  if (const auto cluster = read_cluster(a.netns)) {
    std::vector<int> per_host;
    for (int h = 0; h < cluster->hosts; ++h) per_host.push_back(cluster->ranks_on(h, a.np));
    t.hosts = static_cast<int>(
        std::count_if(per_host.begin(), per_host.end(), [](int k) { return k > 0; }));
    t.per_host = *std::max_element(per_host.begin(), per_host.end());
    t.uniform = std::all_of(per_host.begin(), per_host.begin() + t.hosts,
                            [&](int k) { return k == t.per_host; });
  }
  std::vector<std::string> names;
  for (const comm::algo::Algorithm* al : comm::algo::algorithms_of(*kind_of(p.collectives[0])))
    if (comm::algo::can_run(*al, t, a.np)) names.emplace_back(al->name);
  return names;
}

int run_driver(const BenchArgs& a) {
  const Plan p = make_plan(a);
  if (a.np < 1)
    throw InvalidArgumentError(
        fmt::format("dtrain bench: --np is {}: start at least one rank", a.np));
  // --backend native,gloo: the first is "dtrain", the others are timed after it and shown as
  // columns "dtrain-gloo", like peers, so that one run compares the backends.
  const std::vector<std::string> backends = split_backends(a.backend);
  for (const auto& b : backends)
    if (b == "mpi")
      throw InvalidArgumentError(
          "dtrain bench: --backend mpi takes its ranks from mpirun: run `mpirun -np N dtrain bench "
          "COLL --backend mpi` instead of the driver");
  const std::vector<std::string> algorithms = all_algorithms(a, p);
  std::string sizes;
  for (size_t s : p.sizes) sizes += (sizes.empty() ? "" : ",") + bench::format_bytes(s);
  std::fprintf(
      stderr,
      "dtrain bench: %s, np %d, sizes %s, %s, iters %d, warmup %d, rounds %d, check %s%s%s\n",
      a.collectives.c_str(), a.np, sizes.c_str(), a.dtype.c_str(), a.iters, a.warmup, a.rounds,
      a.check ? "on" : "off", p.peers.empty() ? "" : ", peers ", a.peers.c_str());
  // Before any thread (the store servers'): it takes SIGINT, SIGTERM and SIGCHLD for itself,
  // and ignores SIGPIPE from a child's closed pipe.
  launch::Supervisor supervisor;

  std::vector<Result> results;
  std::vector<std::string> failures;
  auto collect = [&](Outcome o) {
    results.insert(results.end(), o.results.begin(), o.results.end());
    if (!o.failure.empty()) {
      std::fprintf(stderr, "%s\n", o.failure.c_str());
      failures.push_back(o.failure);
    }
  };
  // Every round runs each implementation once, in the same order, so that the ratios of one
  // round compare runs close in time; a machine that slows down for a while moves one round.
  std::vector<std::string> shown_peers;
  std::vector<std::string> runnable_peers = p.peers;
  int rounds_run = 0;  // a failure ends the run after its round
  for (int round = 1; round <= a.rounds && failures.empty(); ++round, ++rounds_run) {
    if (a.rounds > 1) std::fprintf(stderr, "dtrain bench: round %d of %d\n", round, a.rounds);
    auto numbered = [&](Outcome o) {
      for (auto& r : o.results) r.round = a.rounds > 1 ? round : 0;
      return o;
    };
    for (size_t i = 0; i < backends.size(); ++i) {
      BenchArgs one = a;
      one.backend = backends[i];
      if (one.algo == "all") one.algo.clear();  // the model's choice, then each below
      Outcome o = run_dtrain(supervisor, one, p);
      if (i > 0) {
        const std::string impl = "dtrain-" + backends[i];
        for (auto& r : o.results) r.impl = impl;
        if (round == 1) shown_peers.push_back(impl);
      }
      collect(numbered(std::move(o)));
    }
    for (const std::string& name : algorithms) {
      BenchArgs one = a;
      one.algo = name;
      Outcome o = run_dtrain(supervisor, one, p);
      for (auto& r : o.results) r.impl = "dtrain-" + name;
      if (round == 1) shown_peers.push_back("dtrain-" + name);
      collect(numbered(std::move(o)));
    }
    std::vector<std::string> ran;
    for (const auto& peer : runnable_peers) {
      auto o = run_peer(supervisor, peer, a, p);
      if (!o) continue;  // said why, once: later rounds leave it out
      ran.push_back(peer);
      if (round == 1) shown_peers.push_back(peer);
      collect(numbered(std::move(*o)));
    }
    runnable_peers = ran;
  }
  if (rounds_run < a.rounds)
    std::fprintf(stderr, "dtrain bench: stopped after round %d of %d (the failure above)\n",
                 rounds_run, a.rounds);
  print_tables(p, results, shown_peers, rounds_run, stdout);
  if (!a.json_file.empty()) write_json(a.json_file, results);
  bool wrong =
      std::any_of(results.begin(), results.end(), [](const Result& r) { return r.wrong > 0; });
  if (wrong) std::fprintf(stderr, "dtrain bench: some results were wrong (#wrong > 0)\n");
  return failures.empty() && !wrong ? 0 : 1;
}

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
                  "Also time these: gloo, mpi, mpi-tcp, torch (comma-separated)");
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
