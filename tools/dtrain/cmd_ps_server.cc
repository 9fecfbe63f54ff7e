// `dtrain ps-server`: one parameter server, in the foreground until its workers leave (or
// SIGINT/SIGTERM).
//   Under `dtrain run --servers S` (or with DTRAIN_ROLE/TF_CONFIG/DMLC_* set) it takes its index
//   and the store from the environment and publishes its address there. Standalone (no role in the
//   environment): `dtrain ps-server --port 7000 [--index 0
//   --num-servers 1]` prints "dtrain ps-server: serving on HOST:PORT" first, for scripts.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "common/env.h"
#include "common/signal_watcher.h"
#include "dtrain/error.h"
#include "dtrain/ps.h"
#include "tools/dtrain/commands.h"

namespace dtrain::tools {
namespace {

struct PsServerFlags {
  ps::ServerOptions options;
  int port = 0;
  int checkpoint_every_s = 0;
  bool stay = false;
};

bool has_role() {
  return env::raw(env::kRole) || env::raw(env::kDmlcRole) ||
         (env::raw(env::kTfConfig) &&
          env::raw(env::kTfConfig)->find("\"ps\"") != std::string::npos);
}

int run_standalone(ps::ServerOptions options) {
  options.job_id = env::get_string(env::kJobId);
  options.token = env::get_string(env::kAuthToken);
  // The watcher exists before the server's threads, so that they inherit the blocked signals.
  std::atomic<ps::Server*> running{nullptr};
  std::atomic<bool> stop_requested{false};
  std::optional<SignalWatcher> signals;
  signals.emplace([&](int sig) {
    std::fprintf(stderr, "dtrain ps-server: %s received, stopping\n", strsignal(sig));
    stop_requested = true;
    if (ps::Server* s = running.load()) s->stop();
  });
  ps::Server server(options);
  running = &server;
  if (stop_requested) server.stop();
  std::printf("dtrain ps-server: serving on %s\n", server.address().c_str());
  std::fflush(stdout);
  server.wait();
  signals.reset();  // joins the watcher: no stop() can be running once the server is destroyed
  running = nullptr;
  if (!options.checkpoint_dir.empty()) server.checkpoint();
  return 0;
}

}  // namespace

CLI::App* add_ps_server_command(CLI::App& app) {
  auto f = std::make_shared<PsServerFlags>();
  CLI::App* cmd =
      app.add_subcommand("ps-server", "Run a parameter server (`dtrain docs parameter_server`)");
  cmd->add_option("--port", f->port, "Port to listen on (default: any free port)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--host", f->options.listen_host,
                  "Address to listen on (default: every interface)");
  cmd->add_option("--advertise", f->options.advertise_host,
                  "Address workers dial (default: the address that routes to the store)");
  cmd->add_option("--index", f->options.index, "Standalone: this server's index");
  cmd->add_option("--num-servers", f->options.num_servers, "Standalone: number of servers");
  cmd->add_option(
      "--checkpoint-dir", f->options.checkpoint_dir,
      "Write checkpoints of the tables to DIR/server-<index>/ (DTRAIN_PS_CHECKPOINT_DIR)");
  cmd->add_option("--checkpoint-every", f->checkpoint_every_s,
                  "Seconds between checkpoints (0 = on request and at exit)");
  cmd->add_option("--keep", f->options.keep_checkpoints, "Checkpoints to keep");
  cmd->add_flag("--restore", f->options.restore,
                "Start from the newest good checkpoint in the checkpoint directory");
  cmd->add_flag("--stay", f->stay, "Keep serving after every worker left (until a signal)");
  cmd->callback([f] {
    ps::ServerOptions o = f->options;
    o.port = static_cast<uint16_t>(f->port);
    o.checkpoint_every = std::chrono::seconds(f->checkpoint_every_s);
    o.exit_when_workers_leave = !f->stay;
    int rc = has_role() ? ps::run_server_from_env(o) : run_standalone(o);
    if (rc != 0) std::exit(rc);
  });
  return cmd;
}

}  // namespace dtrain::tools
