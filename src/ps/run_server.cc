// run_server_from_env: a server (or, for ps-lite jobs, the scheduler) of the job the environment
// describes, until the workers leave or SIGTERM/SIGINT arrives.
#include <atomic>
#include <cstring>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "common/env.h"
#include "common/log.h"
#include "common/signal_watcher.h"
#include "common/socket.h"
#include "dtrain/error.h"
#include "dtrain/ps.h"
#include "dtrain/ps_cluster.h"
#include "dtrain/store.h"

namespace dtrain::ps {

namespace {

// Long enough to mean "until the job ends", short enough not to overflow a deadline.
constexpr std::chrono::milliseconds kJobLifetime = std::chrono::hours(24 * 365);
// How long the scheduler waits, when every server is done, for the servers to hang up.
constexpr std::chrono::milliseconds kSchedulerLinger{5'000};

}  // namespace

int run_server_from_env(ServerOptions options) {
  Cluster cluster = resolve_cluster();
  if (options.checkpoint_dir.empty())
    options.checkpoint_dir = env::get_string(env::kPsCheckpointDir);
  if (options.checkpoint_every.count() == 0)
    options.checkpoint_every =
        std::chrono::seconds(env::get_int(env::kPsCheckpointEvery).value_or(0));
  if (!options.restore) options.restore = env::get_bool(env::kPsRestore);
  options.job_id = env::get_string(env::kJobId);
  options.token = env::get_string(env::kAuthToken);
  options.num_servers = cluster.num_servers;
  const auto connect_timeout =
      std::chrono::seconds(env::get_int(env::kConnectTimeout).value_or(60));

  std::unique_ptr<TcpStoreServer> store_server;
  std::unique_ptr<TcpStore> store;
  if (cluster.role == Cluster::Role::kScheduler) {
    TcpStoreServerOptions so;
    so.port = cluster.store_port;
    store_server = std::make_unique<TcpStoreServer>(so);
    DTRAIN_LOG_INFO("ps scheduler: hosting the store on port {} for {} servers and {} workers",
                    store_server->port(), cluster.num_servers, cluster.num_workers);
  }
  if (cluster.servers.empty()) {
    TcpStoreOptions so;
    so.host = cluster.store_addr;
    so.port = cluster.store_port;
    so.connect_timeout = connect_timeout;
    so.timeout = kJobLifetime;
    store = std::make_unique<TcpStore>(so);
  }
  if (cluster.role == Cluster::Role::kScheduler) {
    // Serve the store until every server has finished, then until they have hung up: the last
    // server's set of its done key is answered only after it woke this wait, and a store gone
    // before the answer fails that server as if the job had crashed.
    store->wait({fmt::format("ps/server_done/{}", cluster.num_servers - 1)}, kJobLifetime);
    store.reset();
    store_server->stop(kSchedulerLinger);
    return 0;
  }
  if (cluster.role != Cluster::Role::kServer)
    throw InvalidArgumentError(
        fmt::format("this process is a {} ({}); `dtrain ps-server` runs servers",
                    to_string(cluster.role), cluster.source));

  options.index =
      cluster.index >= 0 ? cluster.index : static_cast<int>(store->add("ps/next_server", 1) - 1);
  if (!cluster.servers.empty()) {
    // TF_CONFIG: listen on the port the cluster lists for this task.
    auto hp = net::parse_host_port(cluster.servers.at(options.index), "TF_CONFIG cluster.ps entry");
    options.port = hp.port;
    if (options.advertise_host.empty()) options.advertise_host = hp.host;
  } else if (options.advertise_host.empty()) {
    options.advertise_host = store->local_ip();
  }
  // The watcher exists before the server's threads, so that they inherit the blocked signals.
  std::atomic<Server*> running{nullptr};
  std::atomic<bool> stop_requested{false};
  std::optional<SignalWatcher> signals;
  signals.emplace([&](int sig) {
    DTRAIN_LOG_INFO("ps server {}: {} received; stopping", options.index, strsignal(sig));
    stop_requested = true;
    if (Server* s = running.load()) s->stop();
  });
  Server server(options);
  running = &server;
  if (stop_requested) server.stop();
  if (store) server.publish(*store);
  server.wait();
  signals.reset();  // joins the watcher: no stop() can be running once the server is destroyed
  running = nullptr;
  if (!options.checkpoint_dir.empty()) {
    try {
      server.checkpoint();
    } catch (const std::exception& e) {
      DTRAIN_LOG_ERROR("ps server {}: final checkpoint failed: {}", options.index, e.what());
    }
  }
  if (store) {
    int64_t done = store->add("ps/servers_finished", 1);
    store->set(fmt::format("ps/server_done/{}", done - 1), "1");
  }
  return 0;
}

}  // namespace dtrain::ps
