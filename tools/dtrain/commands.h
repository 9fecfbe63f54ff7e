// The `dtrain` command's subcommands; each file registers one on the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace dtrain::tools {

// Each returns the subcommand it added; main() runs the callback of the one chosen.
CLI::App* add_run_command(CLI::App& app);         // cmd_run.cc: the launcher
CLI::App* add_store_command(CLI::App& app);       // cmd_store.cc: a standalone store server
CLI::App* add_env_command(CLI::App& app);         // cmd_env.cc: the environment variable table
CLI::App* add_algorithms_command(CLI::App& app);  // cmd_algorithms.cc: the collective algorithms
CLI::App* add_bench_command(CLI::App& app);  // cmd_bench.cc: collectives, dtrain beside its peers
CLI::App* add_ps_server_command(CLI::App& app);      // cmd_ps_server.cc: a parameter server
CLI::App* add_data_command(CLI::App& app);           // cmd_data.cc: shard files for ShardedDataset
CLI::App* add_pipeline_plan_command(CLI::App& app);  // cmd_pipeline_plan.cc: schedules, verified
CLI::App* add_estimate_command(CLI::App& app);       // cmd_estimate.cc: memory per rank, per layout
CLI::App* add_predict_command(CLI::App& app);  // cmd_predict.cc: step time and efficiency at scale
CLI::App* add_sched_sim_command(CLI::App& app);  // cmd_sched_sim.cc: cluster scheduling simulator
// cmd_doctor.cc: why a job hangs, fails or is slow, from every rank's flight record
CLI::App* add_doctor_command(CLI::App& app);
CLI::App* add_top_command(CLI::App& app);  // cmd_top.cc: a live view from dtrain run's metrics
// cmd_chaos.cc: a job under a seeded fault schedule and without, and what the faults cost it
CLI::App* add_chaos_command(CLI::App& app);
CLI::App* add_docs_command(CLI::App& app);  // cmd_docs.cc: the documentation, installed
// cmd_submit.cc: `submit`, `jobs`, `logs`, `cancel` through the cluster's engine
CLI::App* add_submit_commands(CLI::App& app);

}  // namespace dtrain::tools
