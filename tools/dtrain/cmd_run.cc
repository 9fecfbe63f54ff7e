// `dtrain run`: the launcher. On node 0 it hosts the rendezvous store, then starts N workers with
// the variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK,
// MASTER_ADDR, MASTER_PORT), so that torchrun scripts run unchanged, and supervises them.
//   dtrain run -n 4 -- python train.py
//   dtrain run -n 8 --nnodes 2 --node-rank 1 --master-addr node0 ./train
//   dtrain run -n 4 --servers 2 -- ./train      (parameter server: 2 `dtrain ps-server`s)
// With --max-restarts, --nnodes MIN:MAX, --rdzv-endpoint or --rdzv-id it runs the elastic agent
// instead (launch/elastic_agent.h): restarts after failures, machines joining and leaving.
//   dtrain run -n 4 --max-restarts 3 -- ./train --checkpoint-dir ckpt
//   dtrain run -n 4 --nnodes 1:4 --max-restarts 3 --rdzv-endpoint node0:29400 --rdzv-id job7
//   ./train
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "comm/spare_place.h"
#include "common/env.h"
#include "common/log.h"
#include "common/socket.h"
#include "dtrain/error.h"
#include "dtrain/store.h"
#include "launch/allocator_preload.h"
#include "launch/cpu_binding.h"
#include "launch/elastic_agent.h"
#include "launch/flight_dir.h"
#include "launch/fork_server.h"
#include "launch/gpu_topology.h"
#include "launch/hang_monitor.h"
#include "launch/live_nodes.h"
#include "launch/metrics/metrics_endpoint.h"
#include "launch/supervisor.h"
#include "launch/tf_config.h"
#include "tools/dtrain/commands.h"
#include "tools/dtrain/spelling.h"

namespace dtrain::tools {
namespace {

constexpr uint16_t kDefaultPort = 29500;

struct RunArgs {
  int nproc = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = kDefaultPort;
  bool port_given = false;
  bool no_prefix = false;
  std::string bind = "auto";  // auto: a share of the CPUs each when they suffice; none
  int gpus_per_proc = 0;      // > 0: GPU sets from the node's topology (CUDA_VISIBLE_DEVICES)
  double grace_period_s = 3.0;
  int servers = 0;                       // parameter servers, started by node 0's launcher
  bool server_program = false;           // servers run the worker command (DTRAIN_ROLE=server)
  int metrics_port = -1;                 // >= 0: serve Prometheus metrics there (0: any free port)
  std::string metrics_addr = "0.0.0.0";  // ... on this interface
  bool no_jemalloc = false;  // leave the workers' allocator alone (launch/allocator_preload.h)
  bool tf_config = false;    // give each worker (and server) the TF_CONFIG of the cluster
  bool live = false;         // live recovery: a worker's death leaves the others running
  int replace = 0;           // with live: start this many replacements for dead workers in all
  int spares = 0;            // with live: workers started ahead to take dead ones' places
  std::vector<std::string> preload;  // spares and replacements forked from a server (Python)
  std::vector<std::string> command;
};

// The elastic agent's flags, beside the ones above.
struct ElasticArgs {
  std::string nnodes = "1";  // "N" or "MIN:MAX"
  int max_restarts = 0;
  std::string rdzv_endpoint;
  std::string rdzv_id;
  double rdzv_timeout_s = 600;
  double rdzv_last_call_s = 2;
  double heartbeat_timeout_s = 10;
  int exclude_after = 3;
  double exclude_for_s = 60;
  std::string node_name;
  std::string local_addr;
};

// "4" -> 4:4, "1:4" -> 1:4.
std::pair<int, int> parse_nnodes(const std::string& text) {
  auto bad = [&] {
    return InvalidArgumentError(
        fmt::format("--nnodes '{}': give a number of nodes (2) or a range MIN:MAX (1:4)", text));
  };
  auto number = [&](const std::string& part) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(part, &used);
    } catch (const std::exception&) {
      throw bad();
    }
    if (used != part.size()) throw bad();
    return v;
  };
  size_t colon = text.find(':');
  if (colon == std::string::npos) {
    int n = number(text);
    return {n, n};
  }
  return {number(text.substr(0, colon)), number(text.substr(colon + 1))};
}

// Bounds that keep the arithmetic on ranks and counts far from overflow.
constexpr int kMaxLocalWorkers = 4096;
constexpr int64_t kMaxWorldSize = int64_t{1} << 20;

std::chrono::milliseconds seconds_flag(double s, const char* flag) {
  return env::seconds(flag, s);  // finite, from 0 to a year
}

void validate(const RunArgs& a) {
  if (a.nproc < 1)
    throw InvalidArgumentError(fmt::format("-n is {}: start at least one worker", a.nproc));
  if (a.nproc > kMaxLocalWorkers)
    throw InvalidArgumentError(fmt::format(
        "-n is {}: at most {} workers per node (each is a process with its own connections)",
        a.nproc, kMaxLocalWorkers));
  if (a.nnodes < 1)
    throw InvalidArgumentError(
        fmt::format("--nnodes is {}: a job has at least one node", a.nnodes));
  if (static_cast<int64_t>(a.nnodes) * a.nproc > kMaxWorldSize)
    throw InvalidArgumentError(fmt::format(
        "--nnodes {} with -n {} makes {} ranks: at most {} (ranks are int32 everywhere)", a.nnodes,
        a.nproc, static_cast<int64_t>(a.nnodes) * a.nproc, kMaxWorldSize));
  if (a.node_rank < 0 || a.node_rank >= a.nnodes)
    throw InvalidArgumentError(
        fmt::format("--node-rank is {} but --nnodes is {}: the node rank must be between 0 and {}",
                    a.node_rank, a.nnodes, a.nnodes - 1));
  if (a.master_port < 0 || a.master_port > 65535)
    throw InvalidArgumentError(
        fmt::format("--master-port is {}: use 1-65535 (or 0 for any free port)", a.master_port));
  if (a.master_port == 0 && a.nnodes > 1)
    throw InvalidArgumentError(
        "--master-port 0 needs --nnodes 1: the other nodes must know the store's port in advance");
  seconds_flag(a.grace_period_s, "--grace-period");  // finite, from 0 to a year
  if (a.command.empty())
    throw InvalidArgumentError("dtrain run needs a worker command: dtrain run -n 2 -- ./train");
  if (a.servers < 0)
    throw InvalidArgumentError(fmt::format("--servers is {}: it cannot be negative", a.servers));
}

// This executable, for `dtrain ps-server` children.
std::string self_executable() {
  std::error_code ec;
  auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "dtrain";  // found on PATH
  return path.string();
}

// `python` or `python3` as the worker command means the environment dtrain belongs to: the one
// whose bin/ holds this executable (pip installed it there), else the one it was built for. The
// python3 first on PATH is often another interpreter, without torch or dtrain. A path, or any
// other name, runs as given.
void use_the_environments_python(std::vector<std::string>& command) {
  if (command.empty() || (command[0] != "python" && command[0] != "python3")) return;
  std::error_code ec;
  const auto beside = std::filesystem::path(self_executable()).parent_path() / "python";
  std::string python;
  if (std::filesystem::exists(beside, ec) &&
      std::filesystem::exists(beside.parent_path().parent_path() / "pyvenv.cfg", ec))
    python = beside.string();
#ifdef DTRAIN_PYTHON_EXECUTABLE
  else if (std::filesystem::exists(DTRAIN_PYTHON_EXECUTABLE, ec))
    python = DTRAIN_PYTHON_EXECUTABLE;
#endif
  if (python.empty()) return;
  fmt::print(stderr,
             "dtrain run: {} is {} (the Python environment dtrain is installed for; give a path "
             "to run another)\n",
             command[0], python);
  command[0] = python;
}

// jemalloc for the workers (launch/allocator_preload.h), through the launcher's own environment,
// which every worker, server and restarted round inherits.
void preload_jemalloc(bool opted_out) {
  if (opted_out) return;
#ifdef DTRAIN_JEMALLOC_PATH
  const char* path = DTRAIN_JEMALLOC_PATH;
#else
  const char* path = nullptr;
#endif
  const auto plan =
      launch::plan_allocator_preload(path, std::getenv("LD_PRELOAD"), std::getenv("MALLOC_CONF"));
  if (!plan.ld_preload.empty()) ::setenv("LD_PRELOAD", plan.ld_preload.c_str(), 1);
  if (!plan.malloc_conf.empty()) ::setenv("MALLOC_CONF", plan.malloc_conf.c_str(), 1);
  if (!plan.note.empty()) fmt::print(stderr, "{}\n", plan.note);
}

// The store of the job, hosted by this launcher (node 0 only).
std::unique_ptr<TcpStoreServer> start_store(const RunArgs& a) {
  TcpStoreServerOptions o;
  // A single-node job on loopback stays off the network; otherwise the other nodes must reach it.
  o.host = (a.nnodes == 1 && a.master_addr == "127.0.0.1") ? "127.0.0.1" : "";
  o.port = static_cast<uint16_t>(a.master_port);
  // PyTorch scripts meet the same store, as under torchrun (TORCHELASTIC_USE_AGENT_STORE below).
  o.torch_clients = true;
  // With the default port on one node, any port does as well: the workers learn it from
  // MASTER_PORT. With several nodes or a port asked for explicitly, a busy port is an error.
  if (a.port_given || a.nnodes > 1) return std::make_unique<TcpStoreServer>(o);
  try {
    return std::make_unique<TcpStoreServer>(o);
  } catch (const Error& e) {
    o.port = 0;
    auto store = std::make_unique<TcpStoreServer>(o);
    DTRAIN_LOG_INFO("dtrain run: cannot host the store on port {} ({}); using port {} instead",
                    kDefaultPort, e.what(), store->port());
    return store;
  }
}

// This node's GPU topology: DTRAIN_GPU_TOPOLOGY's file, else `nvidia-smi topo -m`.
launch::GpuTopology read_gpu_topology() {
  const std::string file = env::get_string(env::kGpuTopology);
  std::string text;
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in)
      throw InvalidArgumentError(fmt::format("dtrain run: cannot read DTRAIN_GPU_TOPOLOGY={}: {}",
                                             file, std::strerror(errno)));
    text.assign(std::istreambuf_iterator<char>(in), {});
  } else {
    FILE* p = ::popen("nvidia-smi topo -m 2>&1", "r");
    char buf[4096];
    while (p != nullptr && std::fgets(buf, sizeof buf, p) != nullptr) text += buf;
    const int status = p != nullptr ? ::pclose(p) : -1;
    if (status != 0)
      throw InvalidArgumentError(fmt::format(
          "dtrain run --gpus-per-proc: `nvidia-smi topo -m` failed ({}): no NVIDIA driver here? "
          "Point DTRAIN_GPU_TOPOLOGY at a file with its output, or leave --gpus-per-proc out",
          text.empty() ? "not found" : text.substr(0, text.find('\n'))));
  }
  return launch::parse_nvidia_smi_topo(text);
}

// A local rank's GPUs and the CPUs it runs on.
struct GpuShare {
  std::string visible;  // CUDA_VISIBLE_DEVICES
  std::vector<int> cpus;
};

// --gpus-per-proc: each local rank the closest GPU set left, and its CPUs on those GPUs' NUMA
// node, shared with the other ranks whose GPUs sit there. Empty without the flag.
std::vector<GpuShare> plan_gpus(const RunArgs& a, const std::vector<int>& cpus) {
  if (a.gpus_per_proc <= 0) return {};
  const auto topology = read_gpu_topology();
  const auto sets = launch::pick_gpu_sets(topology, a.nproc, a.gpus_per_proc);
  std::vector<std::vector<int>> near_cpus;
  for (const auto& set : sets) {
    std::vector<int> near;
    for (int g : set)
      for (int c : topology.cpus[g])
        if (std::find(cpus.begin(), cpus.end(), c) != cpus.end() &&
            std::find(near.begin(), near.end(), c) == near.end())
          near.push_back(c);
    std::sort(near.begin(), near.end());
    near_cpus.push_back(near);
  }
  std::vector<GpuShare> shares(a.nproc);
  for (int local = 0; local < a.nproc; ++local) {
    const auto& set = sets[local];
    shares[local].visible = fmt::format("{}", fmt::join(set, ","));
    if (!near_cpus[local].empty()) {
      int index = 0, sharing = 0;  // this rank's place among those near the same CPUs
      for (int other = 0; other < a.nproc; ++other) {
        if (near_cpus[other] != near_cpus[local]) continue;
        if (other < local) ++index;
        ++sharing;
      }
      shares[local].cpus = launch::cpu_share(index, sharing, near_cpus[local]);
    }
    std::string links;
    for (size_t i = 1; i < set.size(); ++i)
      links += (links.empty() ? " (" : ", ") + topology.link[set[0]][set[i]];
    DTRAIN_LOG_INFO("dtrain run: local rank {}: GPUs {}{}{}", local, shares[local].visible,
                    links.empty() ? "" : links + ")",
                    near_cpus[local].empty() ? std::string()
                                             : ", CPUs " + launch::describe_cpus(near_cpus[local]));
  }
  return shares;
}

int run_elastic_job(const RunArgs& a, const ElasticArgs& e, bool node_rank_given,
                    bool master_given) {
  if (node_rank_given)
    throw InvalidArgumentError(
        "--node-rank cannot be given to an elastic run (--max-restarts, --nnodes MIN:MAX, "
        "--rdzv-*): the rendezvous assigns node ranks, in the order the agents arrive");
  seconds_flag(a.grace_period_s, "--grace-period");  // finite, from 0 to a year
  launch::ElasticOptions o;
  o.command = a.command;
  o.nproc = a.nproc;
  std::tie(o.min_nodes, o.max_nodes) = parse_nnodes(e.nnodes);
  o.max_restarts = e.max_restarts;
  o.endpoint = e.rdzv_endpoint;
  // Without --rdzv-endpoint, --master-addr:--master-port stand in when given; a multi-machine
  // run with neither is refused (each machine would otherwise form a job of its own).
  if (o.endpoint.empty() && master_given)
    o.endpoint = net::HostPort{a.master_addr, static_cast<uint16_t>(a.master_port)}.to_string();
  o.run_id = e.rdzv_id.empty() ? env::get_string(env::kJobId) : e.rdzv_id;
  o.node_name = e.node_name;
  o.local_addr = e.local_addr;
  o.join_timeout = seconds_flag(e.rdzv_timeout_s, "--rdzv-timeout");
  o.last_call = seconds_flag(e.rdzv_last_call_s, "--rdzv-last-call");
  o.heartbeat_timeout = seconds_flag(e.heartbeat_timeout_s, "--heartbeat-timeout");
  o.exclude_after = e.exclude_after;
  o.exclude_for = seconds_flag(e.exclude_for_s, "--exclude-for");
  o.grace_period = seconds_flag(a.grace_period_s, "--grace-period");
  o.prefix_output = !a.no_prefix;
  o.bind = a.bind == "auto";
  // The machine's GPUs do not change between rounds: each local rank keeps its set.
  for (const auto& share : plan_gpus(a, o.bind ? launch::allowed_cpus() : std::vector<int>{}))
    o.local_ranks.push_back({share.visible, share.cpus});
  std::unique_ptr<launch::MetricsEndpoint> metrics;
  if (a.metrics_port >= 0) {
    metrics = std::make_unique<launch::MetricsEndpoint>(
        launch::MetricsEndpointOptions{.port = a.metrics_port, .address = a.metrics_addr});
    o.env.emplace_back(env::kProgressDir.name, metrics->progress_dir());
    o.on_round = [&metrics, nproc = a.nproc](int restarts, int first_rank) {
      metrics->set_restarts(restarts);
      metrics->set_ranks(first_rank, nproc);
    };
  }
  return launch::run_elastic(o);
}

int run_job(const RunArgs& a) {
  validate(a);
  // Before the store starts its threads, so that they inherit the blocked signals.
  launch::Supervisor supervisor;
  std::unique_ptr<TcpStoreServer> store;
  uint16_t port = static_cast<uint16_t>(a.master_port);
  if (a.node_rank == 0) {
    store = start_store(a);
    port = store->port();
  }

  std::unique_ptr<launch::MetricsEndpoint> metrics;
  if (a.metrics_port >= 0) {
    metrics = std::make_unique<launch::MetricsEndpoint>(
        launch::MetricsEndpointOptions{.port = a.metrics_port,
                                       .address = a.metrics_addr,
                                       .first_rank = a.node_rank * a.nproc,
                                       .ranks = a.nproc});
  }
  const launch::FlightDir flight = launch::FlightDir::prepare();
  const std::string& flight_dir = flight.path();
  if (metrics) metrics->set_flight_dir(flight_dir);
  const double started =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  launch::HangMonitor hang_monitor(
      {.dir = flight_dir, .hang = env::get_seconds(env::kHangSeconds)});

  launch::SupervisorOptions options;
  options.command = a.command;
  options.failure_records = flight_dir;
  options.prefix_output = !a.no_prefix;
  options.grace_period = seconds_flag(a.grace_period_s, "--grace-period");
  options.keep_survivors = a.live;
  options.replacements = a.replace;
  options.replacement_env.emplace_back(env::kLiveReplacement.name, "1");
  options.spares = a.spares;
  options.preload = a.preload;
  options.place_spare = [&flight](int spare, const launch::WorkerSpec& place) {
    comm::SparePlace where{.rank = place.rank};
    for (const auto& [name, value] : place.env)
      if (name == env::kLocalRank.name) where.local_rank = std::stoi(value);
    comm::write_spare_place(flight.path(), spare, where);
  };
  int world_size = a.nnodes * a.nproc;
  // Parameter servers beside the workers share the CPUs with them: no binding then.
  const auto cpus =
      a.bind == "auto" && a.servers == 0 ? launch::allowed_cpus() : std::vector<int>{};
  const auto gpus = plan_gpus(a, cpus);
  launch::TfConfigs tf;
  if (a.tf_config) tf = launch::tf_configs(a.master_addr, world_size, a.servers);
  for (int local = 0; local < a.nproc; ++local) {
    int rank = a.node_rank * a.nproc + local;
    options.workers.push_back(launch::WorkerSpec{
        rank,
        {{"RANK", std::to_string(rank)},
         {"WORLD_SIZE", std::to_string(world_size)},
         {"LOCAL_RANK", std::to_string(local)},
         {"LOCAL_WORLD_SIZE", std::to_string(a.nproc)},
         {"NODE_RANK", std::to_string(a.node_rank)},
         {"GROUP_RANK", std::to_string(a.node_rank)},
         {"GROUP_WORLD_SIZE", std::to_string(a.nnodes)},
         {"MASTER_ADDR", a.master_addr},
         {"MASTER_PORT", std::to_string(port)},
         // The launcher of node 0 hosts the store, so rank 0 must not host another; torch's
         // init_process_group connects to it too, as under torchrun.
         {"DTRAIN_AGENT_STORE", "1"},
         {"TORCHELASTIC_USE_AGENT_STORE", "True"},
         {"TORCHELASTIC_RESTART_COUNT", "0"},
         {"TORCHELASTIC_MAX_RESTARTS", "0"},
         {"TORCHELASTIC_RUN_ID", env::get_string(env::kJobId)},
         {std::string(env::kFlightDir.name), flight_dir}}});
    options.workers.back().cpus = launch::cpu_share(local, a.nproc, cpus);
    if (a.live) options.workers.back().env.emplace_back(env::kLive.name, "1");
    if (metrics)
      options.workers.back().env.emplace_back(env::kProgressDir.name, metrics->progress_dir());
    if (!gpus.empty()) {
      options.workers.back().env.emplace_back("CUDA_VISIBLE_DEVICES", gpus[local].visible);
      if (!gpus[local].cpus.empty()) options.workers.back().cpus = gpus[local].cpus;
    }
    if (a.tf_config) options.workers.back().env.emplace_back("TF_CONFIG", tf.workers[rank]);
    if (a.servers > 0) {
      auto& env = options.workers.back().env;
      env.emplace_back("DTRAIN_ROLE", "worker");
      env.emplace_back("DTRAIN_NUM_SERVERS", std::to_string(a.servers));
      env.emplace_back("DTRAIN_NUM_WORKERS", std::to_string(world_size));
    }
  }
  // Parameter servers (node 0): `dtrain ps-server`, or the worker command in the server role.
  // They publish their addresses in the store and exit once every worker has left (or are
  // stopped once every worker has exited, goodbye or not); one that dies fails the job like a
  // worker would.
  if (a.node_rank == 0) {
    for (int i = 0; i < a.servers; ++i) {
      launch::WorkerSpec spec{world_size + i,
                              {{"DTRAIN_ROLE", "server"},
                               {"DTRAIN_PS_INDEX", std::to_string(i)},
                               {"DTRAIN_NUM_SERVERS", std::to_string(a.servers)},
                               {"DTRAIN_NUM_WORKERS", std::to_string(world_size)},
                               {"WORLD_SIZE", std::to_string(world_size)},
                               {"MASTER_ADDR", a.master_addr},
                               {"MASTER_PORT", std::to_string(port)},
                               {"DTRAIN_AGENT_STORE", "1"}},
                              {},
                              fmt::format("server {}", i)};
      if (a.tf_config) spec.env.emplace_back("TF_CONFIG", tf.servers[i]);
      spec.service = true;  // stopped once every worker has exited, whatever they said
      if (!a.server_program) spec.command = {self_executable(), "ps-server"};
      options.workers.push_back(std::move(spec));
    }
  }
  options.stop_fds = {hang_monitor.stop_fd()};
  // A live job on several nodes: the launchers tell each other's survivors of deaths, and node
  // 0's keeps the store up while the others' workers go on.
  std::unique_ptr<launch::LiveNodes> live_nodes;
  if (a.live && a.nnodes > 1)
    live_nodes = std::make_unique<launch::LiveNodes>(launch::LiveNodesOptions{
        .host = a.master_addr, .port = port, .node = a.node_rank, .nnodes = a.nnodes});
  // How each worker ended, for its peers' errors (comm::launcher_exit_word).
  options.on_exit = [&flight, &live_nodes](const launch::WorkerExit& e) {
    flight.write_exit_word(e.rank, e.how());
    if (live_nodes) live_nodes->worker_ended(e.rank, e.how());
  };
  // A replacement for this node's last worker is taken in by the other nodes' through the store.
  if (live_nodes) options.members_elsewhere = [&live_nodes] { return live_nodes->store_answers(); };
  options.on_sigusr2 = [&hang_monitor] { hang_monitor.request_records(); };
  const launch::SupervisorResult result = supervisor.supervise(options);
  // A launcher told to stop (a signal, or found stuck) does not linger for the other nodes.
  if (live_nodes)
    live_nodes->finish(result.outcome != launch::SupervisorResult::Outcome::kInterrupted &&
                       result.outcome != launch::SupervisorResult::Outcome::kStopped);
  if (hang_monitor.fired()) return launch::kStuckExitCode;
  if (result.outcome == launch::SupervisorResult::Outcome::kFailed) {
    // A failure that wrote flight records (a timeout, a mismatch, a dead peer): what they say.
    const std::string diagnosis = launch::diagnose_directory(flight_dir, started);
    if (!diagnosis.empty()) fmt::print(stderr, "{}", diagnosis);
  }
  if (result.outcome == launch::SupervisorResult::Outcome::kSucceeded) flight.remove_if_unused();
  return result.exit_code;
}

}  // namespace

CLI::App* add_run_command(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  auto elastic = std::make_shared<ElasticArgs>();
  auto* cmd = app.add_subcommand("run", "Start N workers of a distributed job and supervise them");
  cmd->footer(
      "Usage: dtrain run -n N [--nnodes K --node-rank R --master-addr H --master-port P]\n"
      "                  [--no-prefix] [--grace-period S] [--] CMD ARGS...\n"
      "       dtrain run -n N [--nnodes MIN:MAX] --max-restarts K [--rdzv-endpoint H:P]\n"
      "                  [--rdzv-id JOB] [--] CMD ARGS...        (elastic: one per machine)\n"
      "       dtrain run -n N --servers S [--] CMD ARGS...   (parameter server: S servers)\n"
      "Each worker gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR\n"
      "and MASTER_PORT, as under torchrun; elastic runs add DTRAIN_RESTART_COUNT\n"
      "(TORCHELASTIC_RESTART_COUNT). See `dtrain docs fault_tolerance`.");
  cmd->add_option("-n,--nproc-per-node,--nproc_per_node", args->nproc,
                  "Worker processes on this node")
      ->capture_default_str();
  cmd->add_option("--nnodes", elastic->nnodes, "Nodes in the job: N, or MIN:MAX for an elastic run")
      ->capture_default_str();
  auto* node_rank = cmd->add_option("--node-rank,--node_rank", args->node_rank,
                                    "Index of this node (0 hosts the store); static runs only")
                        ->capture_default_str();
  auto* master_addr = cmd->add_option("--master-addr,--master_addr", args->master_addr,
                                      "Host of node 0, where the store runs")
                          ->capture_default_str();
  auto* port = cmd->add_option("--master-port,--master_port", args->master_port,
                               "Port of the store (0: any free one; the default moves to a free "
                               "one when busy on a single node)")
                   ->capture_default_str();
  cmd->add_flag("--no-prefix", args->no_prefix, "Do not prefix output lines with [rank N]");
  cmd->add_flag("--live", args->live,
                "Live recovery: when a worker dies the others go on, re-forming their group "
                "without it (programs that support it: train_fashion_mnist, dtrain::LiveWorld, "
                "hvd.elastic); on several nodes a side without a majority stops; sets "
                "DTRAIN_LIVE=1");
  cmd->add_option("--replace", args->replace,
                  "With --live: start a new worker in a dead one's place, up to this many times "
                  "in all; the others take it in at a step boundary and send it the training "
                  "state (DTRAIN_LIVE_REPLACEMENT=1)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option(
         "--spares", args->spares,
         "With --live: start this many workers ahead of any failure (DTRAIN_LIVE_SPARE=N); "
         "each builds what its program builds before it first needs the world and waits "
         "(at the idle CPU priority, where dtrain run may raise it again: as root), and takes "
         "a dead worker's place the moment it dies; with --replace, a new spare follows each "
         "one taken")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--preload", args->preload,
                  "With --spares or --replace and a Python command: import these modules once "
                  "(comma-separated: torch,torch._dynamo) in a fork server, and fork every spare "
                  "and replacement from it instead of starting an interpreter that imports them "
                  "again while the others train")
      ->delimiter(',');
  cmd->add_flag("--no-jemalloc", args->no_jemalloc,
                "Do not preload jemalloc into the workers (by default they get it, with the "
                "settings dtrain's own programs use: Python jobs train faster)");
  cmd->add_option("--bind", args->bind,
                  "auto: with no more workers than CPUs, bind each to its own equal share of them "
                  "(as mpirun does); none: leave placement to the scheduler")
      ->check(CLI::IsMember({"auto", "none"}))
      ->capture_default_str();
  cmd->add_option("--gpus-per-proc", args->gpus_per_proc,
                  "GPUs per worker, chosen from the node's topology (nvidia-smi topo -m): each "
                  "worker the closest set left (NVLink, PCIe switch, host bridge, NUMA node), "
                  "CUDA_VISIBLE_DEVICES set and its CPUs on their NUMA node")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cmd->add_option("--servers", args->servers,
                  "Parameter servers to start beside the workers (node 0; see "
                  "`dtrain docs parameter_server`)")
      ->capture_default_str();
  cmd->add_flag("--server-program", args->server_program,
                "The servers run the worker command with DTRAIN_ROLE=server instead of `dtrain "
                "ps-server`");
  cmd->add_flag("--tf-config", args->tf_config,
                "Give each process the TF_CONFIG of the cluster (one node), so that TensorFlow's "
                "own strategies run under dtrain run: every rank a worker, or with --servers "
                "rank 0 the chief and the servers ps tasks (`dtrain docs tensorflow`)");
  cmd->add_option("--metrics-port", args->metrics_port,
                  "Serve the workers' progress (dtrain::ProgressReporter) and the restarts as "
                  "Prometheus metrics at http://HOST:PORT/metrics (0: any free port; "
                  "`dtrain docs metrics`)");
  cmd->add_option("--metrics-addr", args->metrics_addr,
                  "The interface --metrics-port listens on: 0.0.0.0 every one (Prometheus on "
                  "another machine), 127.0.0.1 this machine only")
      ->capture_default_str();
  cmd->add_option("--grace-period", args->grace_period_s,
                  "Seconds between SIGTERM and SIGKILL when stopping the workers")
      ->capture_default_str();
  const std::string group = "Elastic (any of these runs the elastic agent)";
  auto* max_restarts =
      cmd->add_option("--max-restarts,--max_restarts", elastic->max_restarts,
                      "Failures the job survives: the workers restart (from their checkpoint) "
                      "after each")
          ->capture_default_str()
          ->group(group);
  auto* endpoint = cmd->add_option("--rdzv-endpoint,--rdzv_endpoint", elastic->rdzv_endpoint,
                                   "HOST:PORT of the rendezvous store; the agent on HOST (or the "
                                   "first to bind it) hosts it")
                       ->group(group);
  auto* rdzv_id = cmd->add_option("--rdzv-id,--rdzv_id", elastic->rdzv_id,
                                  "Job id: agents with the same id form a job")
                      ->group(group);
  cmd->add_option("--rdzv-timeout,--rdzv_timeout", elastic->rdzv_timeout_s,
                  "Seconds for a round to form (MIN agents) before the agents give up")
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--rdzv-last-call", elastic->rdzv_last_call_s,
                  "Seconds a round waits for more agents once MIN have joined")
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--heartbeat-timeout", elastic->heartbeat_timeout_s,
                  "Seconds without a heartbeat after which an agent counts as dead")
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--exclude-after", elastic->exclude_after,
                  "Failures of one node's workers within --exclude-for that exclude the node "
                  "(0 = never)")
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--exclude-for", elastic->exclude_for_s,
                  "Seconds an excluded node sits out (counted from its last failure)")
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--node-name", elastic->node_name,
                  "Name of this machine in logs and failure counts (default: the host name)")
      ->group(group);
  cmd->add_option("--local-addr", elastic->local_addr,
                  "Address the other machines reach this one at (default: the one that routes "
                  "to the rendezvous store)")
      ->group(group);
  // Everything from the first positional on is the worker command, options included; a "--"
  // before it is optional. CLI11 leaves that "--" (and unknown options) in remaining().
  cmd->add_option("command", args->command, "The worker command and its arguments")->required();
  cmd->positionals_at_end();
  cmd->allow_extras();
  cmd->callback([args, elastic, cmd, port, node_rank, master_addr, max_restarts, endpoint,
                 rdzv_id] {
    for (const auto& extra : cmd->remaining()) {
      if (extra == "--") continue;
      auto near = closest(extra.substr(0, extra.find('=')), option_spellings(*cmd));
      throw InvalidArgumentError(fmt::format(
          "dtrain run: unknown option '{}'{} (see dtrain run --help; put the worker command "
          "after --)",
          extra, near ? fmt::format(": did you mean {}?", *near) : std::string()));
    }
    RunArgs a = *args;
    a.port_given = port->count() > 0;
    const bool is_elastic = max_restarts->count() > 0 || endpoint->count() > 0 ||
                            rdzv_id->count() > 0 || elastic->nnodes.find(':') != std::string::npos;
    use_the_environments_python(a.command);
    preload_jemalloc(a.no_jemalloc);
    int code = 0;
    if (a.tf_config && (is_elastic || a.nnodes > 1 || elastic->nnodes != "1"))
      throw InvalidArgumentError(
          "dtrain run: --tf-config describes the processes of one node, started once: it "
          "cannot be combined with --nnodes above 1 or an elastic run yet; on several nodes "
          "set TF_CONFIG in each node's environment");
    if (a.replace > 0 && !a.live)
      throw InvalidArgumentError(
          "dtrain run: --replace starts workers in dead ones' places while the others go on: it "
          "needs --live");
    if (a.spares > 0 && !a.live)
      throw InvalidArgumentError(
          "dtrain run: --spares starts workers that wait to take dead ones' places while the "
          "others go on: it needs --live");
    if (!a.preload.empty() && a.spares == 0 && a.replace == 0)
      throw InvalidArgumentError(
          "dtrain run: --preload forks spares and replacements from a process that imported "
          "the modules: it needs --spares or --replace");
    if (!a.preload.empty())
      if (const std::string why = launch::ForkServer::why_not_forkable(a.command); !why.empty())
        throw InvalidArgumentError("dtrain run: --preload: " + why);
    if (a.spares > 0 && a.gpus_per_proc > 0)
      throw InvalidArgumentError(
          "dtrain run: --spares cannot be combined with --gpus-per-proc yet: a spare starts "
          "before anyone knows whose devices it will take");
    if (a.live && is_elastic)
      throw InvalidArgumentError(
          "dtrain run: --live keeps the surviving workers running; it cannot be combined with an "
          "elastic run (--max-restarts, --nnodes MIN:MAX, --rdzv-*) yet");
    if (is_elastic) {
      if (a.servers > 0)
        throw InvalidArgumentError(
            "dtrain run: --servers cannot be combined with an elastic run yet (--max-restarts, "
            "--nnodes MIN:MAX, --rdzv-*); restart parameter servers from their checkpoints "
            "(dtrain ps-server --restore)");
      code = run_elastic_job(a, *elastic, node_rank->count() > 0,
                             master_addr->count() > 0 || a.port_given);
    } else {
      auto [min_nodes, max_nodes] = parse_nnodes(elastic->nnodes);
      a.nnodes = min_nodes;
      code = run_job(a);
    }
    // CLI::RuntimeError carries an exit code out of app.parse() without printing anything.
    if (code != 0) throw CLI::RuntimeError(code);
  });
  return cmd;
}

}  // namespace dtrain::tools
