// dtrain: launch distributed jobs and run their services.
//   dtrain run -n 4 -- ./train        start 4 workers (see `dtrain run --help`)
//   dtrain store --port 29500          a standalone rendezvous store
//   dtrain env                         every environment variable dtrain reads
//   dtrain bench allreduce --np 4      time a collective, with --peers gloo,mpi,torch beside it
//   dtrain ps-server                   a parameter server (started by `dtrain run --servers S`)
//   dtrain data write|inspect|index    TFRecord shard files for dtrain::data::ShardedDataset
//   dtrain pipeline-plan               a pipeline schedule, verified offline, drawn and measured
//   dtrain estimate                    memory per rank for DDP, ZeRO 1-3, tensor and pipeline
//                                      layouts
//   dtrain predict                     step time and scaling efficiency at thousands of ranks
//   dtrain sched-sim                   a GPU cluster's job trace replayed under scheduling
//                                      policies
//   dtrain submit|jobs|logs|cancel     a training job through the cluster's engine (Slurm)
//   dtrain doctor DIR                  why a job hangs, fails or is slow, from its flight records
//   dtrain top                         a live view of a running job
//   dtrain chaos --schedule kill:30s   a job under faults and without, and what they cost it
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include "common/log.h"
#include "dtrain/error.h"
#include "tools/dtrain/commands.h"
#include "tools/dtrain/spelling.h"

int main(int argc, char** argv) {
  dtrain::log::logger();  // a DTRAIN_LOG_LEVEL that names no level is reported now, not later
  CLI::App app{"dtrain: distributed training, launched and debugged"};
  app.name("dtrain");
  app.option_defaults()->always_capture_default();  // every --help shows the defaults
  app.require_subcommand(1);
  app.set_version_flag("--version", "dtrain 0.1.0");
  dtrain::tools::add_run_command(app);
  dtrain::tools::add_store_command(app);
  dtrain::tools::add_env_command(app);
  dtrain::tools::add_algorithms_command(app);
  dtrain::tools::add_bench_command(app);
  dtrain::tools::add_ps_server_command(app);
  dtrain::tools::add_data_command(app);
  dtrain::tools::add_pipeline_plan_command(app);
  dtrain::tools::add_estimate_command(app);
  dtrain::tools::add_predict_command(app);
  dtrain::tools::add_sched_sim_command(app);
  dtrain::tools::add_submit_commands(app);
  dtrain::tools::add_doctor_command(app);
  dtrain::tools::add_top_command(app);
  dtrain::tools::add_chaos_command(app);
  dtrain::tools::add_docs_command(app);
  if (argc == 1) {  // a bare `dtrain` shows what it can do
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  try {
    dtrain::tools::check_spelling(app, argc, argv);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    // Messages of the subcommands name themselves ("dtrain run: ..."); others get the prefix.
    std::string_view what = e.what();
    std::fprintf(stderr, "%s%s\n", what.starts_with("dtrain") ? "" : "dtrain: ", e.what());
    return 2;
  }
  return 0;
}
