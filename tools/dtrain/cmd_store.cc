// `dtrain store --port P [--host H] [--job-id J] [--torch-clients]`: a standalone rendezvous
// store in the foreground until SIGINT or SIGTERM. Its first line on stdout is
//   dtrain store: serving on HOST:PORT
// with the real port when --port 0 asked for any free one, so a script can read it.
// DTRAIN_AUTH_TOKEN, when set, is required of every client. --torch-clients also serves
// torch.distributed.TCPStore clients (torch 2.x and 1.13), as the store of `dtrain run` does.
#include <pthread.h>
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/store.h"
#include "tools/dtrain/commands.h"

namespace dtrain::tools {
namespace {

struct StoreFlags {
  std::string host;
  int port = 29500;
  std::string job_id;
  bool torch_clients = false;
};

void run_store(const StoreFlags& flags) {
  // Blocked before the server starts its threads (they inherit the mask), so that the signal
  // reaches only sigwait below and we stop the server cleanly instead of dying mid-reply.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  if (int rc = pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr); rc != 0)
    throw InternalError(fmt::format("dtrain store: cannot block signals: {}", std::strerror(rc)));

  TcpStoreServerOptions options;
  options.host = flags.host;
  options.port = static_cast<uint16_t>(flags.port);
  options.job_id = flags.job_id;
  options.torch_clients = flags.torch_clients;
  TcpStoreServer server(options);
  std::printf("dtrain store: serving on %s:%u\n",
              flags.host.empty() ? "0.0.0.0" : flags.host.c_str(),
              static_cast<unsigned>(server.port()));
  std::fflush(stdout);

  int signal_number = 0;
  while (sigwait(&stop_signals, &signal_number) != 0) {
  }
  std::fprintf(stderr, "dtrain store: %s received, stopping\n", strsignal(signal_number));
  server.stop();
}

}  // namespace

CLI::App* add_store_command(CLI::App& app) {
  auto flags = std::make_shared<StoreFlags>();
  CLI::App* cmd =
      app.add_subcommand("store", "Run a standalone rendezvous store until SIGINT/SIGTERM");
  cmd->add_option("--port", flags->port, "Port to listen on (0 = any free port, printed on start)")
      ->check(CLI::Range(0, 65535))
      ->required();
  cmd->add_option("--host", flags->host, "Address to listen on (default: every interface)");
  cmd->add_option("--job-id", flags->job_id,
                  "Job id clients must present (default: DTRAIN_JOB_ID)");
  cmd->add_flag("--torch-clients", flags->torch_clients,
                "Also serve torch.distributed.TCPStore clients (torch 2.x and 1.13), as under "
                "`dtrain run`; refused when DTRAIN_AUTH_TOKEN is set");
  cmd->callback([flags] { run_store(*flags); });
  return cmd;
}

}  // namespace dtrain::tools
