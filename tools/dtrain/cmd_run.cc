// `dtrain run`: the launcher. On node 0 it hosts the rendezvous store, then starts N workers with
// the variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK,
// MASTER_ADDR, MASTER_PORT), so that torchrun scripts run unchanged, and supervises them.
//   dtrain run -n 4 -- python train.py
//   dtrain run -n 8 --nnodes 2 --node-rank 1 --master-addr node0 ./train
#include <fmt/format.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/log.h"
#include "dtrain/error.h"
#include "dtrain/store.h"
#include "launch/supervisor.h"
#include "tools/dtrain/commands.h"

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
  double grace_period_s = 3.0;
  std::vector<std::string> command;
};

void validate(const RunArgs& a) {
  if (a.nproc < 1)
    throw InvalidArgumentError(fmt::format("-n is {}: start at least one worker", a.nproc));
  if (a.nnodes < 1)
    throw InvalidArgumentError(
        fmt::format("--nnodes is {}: a job has at least one node", a.nnodes));
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
  if (a.grace_period_s < 0)
    throw InvalidArgumentError(
        fmt::format("--grace-period is {}: it cannot be negative", a.grace_period_s));
  if (a.command.empty())
    throw InvalidArgumentError("dtrain run needs a worker command: dtrain run -n 2 -- ./train");
}

// The store of the job, hosted by this launcher (node 0 only).
std::unique_ptr<TcpStoreServer> start_store(const RunArgs& a) {
  TcpStoreServerOptions o;
  // A single-node job on loopback stays off the network; otherwise the other nodes must reach it.
  o.host = (a.nnodes == 1 && a.master_addr == "127.0.0.1") ? "127.0.0.1" : "";
  o.port = static_cast<uint16_t>(a.master_port);
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

  launch::SupervisorOptions options;
  options.command = a.command;
  options.prefix_output = !a.no_prefix;
  options.grace_period = std::chrono::milliseconds(static_cast<int64_t>(a.grace_period_s * 1000));
  int world_size = a.nnodes * a.nproc;
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
         {"MASTER_ADDR", a.master_addr},
         {"MASTER_PORT", std::to_string(port)},
         // The launcher of node 0 hosts the store, so rank 0 must not host another.
         {"DTRAIN_AGENT_STORE", "1"}}});
  }
  return supervisor.run(options);
}

}  // namespace

CLI::App* add_run_command(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  auto* cmd = app.add_subcommand("run", "Start N workers of a distributed job and supervise them");
  cmd->footer(
      "Usage: dtrain run -n N [--nnodes K --node-rank R --master-addr H --master-port P]\n"
      "                  [--no-prefix] [--grace-period S] [--] CMD ARGS...\n"
      "Each worker gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR\n"
      "and MASTER_PORT, as under torchrun.");
  cmd->add_option("-n,--nproc-per-node", args->nproc, "Worker processes on this node")
      ->capture_default_str();
  cmd->add_option("--nnodes", args->nnodes, "Nodes in the job")->capture_default_str();
  cmd->add_option("--node-rank", args->node_rank, "Index of this node (0 hosts the store)")
      ->capture_default_str();
  cmd->add_option("--master-addr", args->master_addr, "Host of node 0, where the store runs")
      ->capture_default_str();
  auto* port = cmd->add_option("--master-port", args->master_port,
                               "Port of the store (0: any free one; the default moves to a free "
                               "one when busy on a single node)")
                   ->capture_default_str();
  cmd->add_flag("--no-prefix", args->no_prefix, "Do not prefix output lines with [rank N]");
  cmd->add_option("--grace-period", args->grace_period_s,
                  "Seconds between SIGTERM and SIGKILL when stopping the workers")
      ->capture_default_str();
  // Everything from the first positional on is the worker command, options included; a "--"
  // before it is optional. CLI11 leaves that "--" (and unknown options) in remaining().
  cmd->add_option("command", args->command, "The worker command and its arguments")->required();
  cmd->positionals_at_end();
  cmd->allow_extras();
  cmd->callback([args, cmd, port] {
    for (const auto& extra : cmd->remaining())
      if (extra != "--")
        throw InvalidArgumentError(fmt::format(
            "dtrain run: unknown option '{}' (see dtrain run --help; put the worker command "
            "after --)",
            extra));
    RunArgs a = *args;
    a.port_given = port->count() > 0;
    int code = run_job(a);
    // CLI::RuntimeError carries an exit code out of app.parse() without printing anything.
    if (code != 0) throw CLI::RuntimeError(code);
  });
  return cmd;
}

}  // namespace dtrain::tools
