// The driver of `dtrain bench`: dtrain's ranks (also once per --backend and per --algo all
// algorithm) and every peer's processes, run after one another in rounds, each bounded by
// --deadline; a failure ends the run after its round.
#include "tools/dtrain/bench_driver.h"

#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "bench/bench_common.h"
#include "bench/machine_bound.h"
#include "comm/algorithms/algorithm.h"
#include "common/socket.h"
#include "dtrain/error.h"
#include "dtrain/store.h"
#include "launch/cpu_binding.h"
#include "launch/supervisor.h"
#include "tools/dtrain/bench_child.h"
#include "tools/dtrain/bench_peers.h"
#include "tools/dtrain/bench_report.h"
#include "tools/dtrain/emulated_cluster.h"

namespace dtrain::tools {
namespace {

using bench::Result;

constexpr std::chrono::milliseconds kKillGrace{2000};

struct Outcome {
  std::vector<Result> results;
  std::string failure;  // empty when every process exited 0
};

// Starts the processes of one implementation with the launcher's supervisor (the same fork,
// output relay, failure handling and stop as `dtrain run`), bounded by `deadline_s`, and takes
// the result lines ('{...}') they print on stdout; the rest of their output goes to stderr.
Outcome run_children(launch::Supervisor& supervisor, const std::string& impl,
                     const std::vector<ChildSpec>& specs, double deadline_s) {
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
  const auto limit = std::chrono::nanoseconds(static_cast<int64_t>(deadline_s * 1e9));
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
          impl, deadline_s);
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

// The arguments the driver passes to every peer.
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

// The command line of each of dtrain's ranks: this bench, as one rank printing result lines.
std::vector<std::string> rank_argv(const BenchArgs& a, const Plan& p) {
  std::string sizes;
  for (size_t s : p.sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(s);
  std::vector<std::string> argv = {self_exe().string(),
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
    argv.push_back("--backend");
    argv.push_back(a.backend);
  }
  if (a.straggle_ms > 0) {
    argv.push_back("--straggle-ms");
    argv.push_back(fmt::format("{}", a.straggle_ms));
  }
  if (!a.algo.empty()) {
    argv.push_back("--algo");
    argv.push_back(a.algo);
  }
  argv.insert(argv.end(), {"--wire", a.wire});
  if (!a.calibrate.empty()) argv.insert(argv.end(), {"--calibrate", a.calibrate});
  if (a.model) argv.push_back("--model");
  if (!a.machine_bound.empty()) argv.insert(argv.end(), {"--machine-bound", a.machine_bound});
  return argv;
}

// dtrain's N ranks, meeting at a store the driver hosts, each on its share of the CPUs
// (--bind auto) or on its host of the emulated cluster.
Outcome run_dtrain(launch::Supervisor& supervisor, const BenchArgs& a, const Plan& p) {
  const auto cluster = read_cluster(a.netns);
  TcpStoreServerOptions so;
  so.host = cluster ? cluster->head() : "127.0.0.1";
  so.port = 0;
  TcpStoreServer store(so);
  const std::vector<std::string> argv = rank_argv(a, p);
  std::vector<ChildSpec> specs;
  for (int r = 0; r < a.np; ++r) {
    ChildSpec s;
    s.label = fmt::format("rank {}", r);
    s.argv = argv;
    s.env = rank_env(r, a.np, store.port());
    if (cluster) place(s, *cluster, r, a.np, cluster->head());
    if (a.bind == "auto") s.cpus = launch::cpu_share(r, a.np, launch::allowed_cpus());
    specs.push_back(std::move(s));
  }
  return run_children(supervisor, "dtrain", specs, a.deadline_s);
}

// Runs peer `name` (make_plan checked it is in the table), or returns nullopt after saying in
// one line why it is skipped.
std::optional<Outcome> run_peer(launch::Supervisor& supervisor, const std::string& name,
                                const BenchArgs& a, const Plan& p) {
  auto skip = [&](const std::string& why) -> std::optional<Outcome> {
    std::fprintf(stderr, "%s: skipped, %s\n", name.c_str(), why.c_str());
    return std::nullopt;
  };
  const PeerRecipe* recipe = find_peer(name);
  if (!recipe) throw InternalError(fmt::format("dtrain bench: no recipe for peer '{}'", name));
  PeerSetup setup;
  setup.name = name;
  setup.np = a.np;
  setup.bin_dir = self_exe().parent_path();
  setup.cluster = read_cluster(a.netns);
  setup.peer_args = bench::to_peer_args(peer_config(a, p));
  if (auto why = recipe->missing(setup)) return skip(*why);
  const std::optional<PeerProbe> probe = recipe->probe ? recipe->probe(setup) : std::nullopt;
  if (probe && !run_children(supervisor, name, {probe->child}, probe->deadline_s).failure.empty())
    return skip(probe->failed);
  // Its store, if any, serves until the run is over.
  const PeerRun run = recipe->start(setup);
  return run_children(supervisor, name, run.children, a.deadline_s);
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

// --bound: what this machine allows, measured before any rank starts (they would share its cores
// and memory), said on stderr, and handed to dtrain's ranks as JSON.
std::string measure_bound(const BenchArgs& a) {
  if (!a.netns.empty())
    throw InvalidArgumentError(
        "dtrain bench: --bound measures this machine's memory and loopback, while --netns's "
        "ranks talk over shaped links: run them apart");
  const bench::MachineBound b = bench::measure_machine_bound();
  std::fprintf(stderr,
               "dtrain bench: this machine allows: memcpy %.2f GB/s (one thread), %.2f GB/s (%d "
               "at once), %.2f GB/s within a core's cache; a loopback TCP stream %.2f GB/s, %.2f "
               "GB/s (%d at once); a socket's round trip %.1f us; a cache line's round trip "
               "%.0f ns\n",
               b.memcpy_gbs, b.memcpy_all_gbs, b.copiers, b.memcpy_cached_gbs, b.tcp_stream_gbs,
               b.tcp_all_gbs, b.copiers, b.socket_round_trip_us, b.cache_line_round_trip_ns);
  return bench::to_json(b);
}

}  // namespace

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
  const std::vector<std::string>& wires = p.wires;
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
  BenchArgs args = a;
  if (a.bound) args.machine_bound = measure_bound(a);

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
      BenchArgs one = args;
      one.backend = backends[i];
      one.wire = wires[0];
      if (one.algo == "all") one.algo.clear();  // the model's choice, then each below
      Outcome o = run_dtrain(supervisor, one, p);
      if (i > 0) {
        const std::string impl = "dtrain-" + backends[i];
        for (auto& r : o.results) r.impl = impl;
        if (round == 1) shown_peers.push_back(impl);
      }
      collect(numbered(std::move(o)));
    }
    for (size_t i = 1; i < wires.size(); ++i) {
      BenchArgs one = args;
      one.backend = backends[0];
      one.wire = wires[i];
      Outcome o = run_dtrain(supervisor, one, p);
      for (auto& r : o.results) r.impl = "dtrain-" + wires[i];
      if (round == 1) shown_peers.push_back("dtrain-" + wires[i]);
      collect(numbered(std::move(o)));
    }
    for (const std::string& name : algorithms) {
      BenchArgs one = args;
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

}  // namespace dtrain::tools
