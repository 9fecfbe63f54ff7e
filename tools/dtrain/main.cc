// dtrain: launch distributed jobs and run their services.
//   dtrain run -n 4 -- ./train        start 4 workers (see `dtrain run --help`)
//   dtrain store --port 29500          a standalone rendezvous store
//   dtrain env                         every environment variable dtrain reads
//   dtrain bench allreduce --np 4      time a collective, with --peers gloo,mpi,torch beside it
//   dtrain ps-server                   a parameter server (started by `dtrain run --servers S`)
#include <cstdio>
#include <exception>

#include "common/log.h"
#include "dtrain/error.h"
#include "tools/dtrain/commands.h"

int main(int argc, char** argv) {
  dtrain::log::logger();  // a DTRAIN_LOG_LEVEL that names no level is reported now, not later
  CLI::App app{"dtrain: distributed training, launched and debugged"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dtrain 0.1.0");
  dtrain::tools::add_run_command(app);
  dtrain::tools::add_store_command(app);
  dtrain::tools::add_env_command(app);
  dtrain::tools::add_bench_command(app);
  dtrain::tools::add_ps_server_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const dtrain::Error& e) {
    std::fprintf(stderr, "dtrain: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain: %s\n", e.what());
    return 2;
  }
  return 0;
}
