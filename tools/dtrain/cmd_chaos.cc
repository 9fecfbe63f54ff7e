// `dtrain chaos --schedule SPEC [--seed N] [-- JOB]`: runs a job once without faults and once
// under a seeded fault schedule, and prints what the faults cost it as its last line:
//   CHAOS {"faults":..,"recovered":..,"goodput":..,"steps_lost":..,"samples_lost":..,...}
// With no job, the main job's example (train_fashion_mnist beside this dtrain) at --ranks ranks
// under `dtrain run --live`. See launch/chaos.h and docs/fault_tolerance.md.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "launch/chaos.h"
#include "tools/dtrain/commands.h"

namespace dtrain::tools {
namespace {

struct ChaosArgs {
  std::string schedule;
  uint64_t seed = 1;
  int max_faults = -1;
  int ranks = 4;
  bool no_baseline = false;
  std::string dir;
  std::string fill_dir;
  int64_t timeout_s = 3600;
  std::vector<std::string> command;
};

// The main job: the example beside this executable, recovering live (`dtrain run --live`), with
// a replacement for every worker killed, so that the world is whole again after each fault.
std::vector<std::string> default_job(int ranks) {
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  const std::filesystem::path trainer = self.parent_path() / "train_fashion_mnist";
  std::error_code ec;
  if (!std::filesystem::exists(trainer, ec))
    throw InvalidArgumentError(fmt::format(
        "dtrain chaos: with no job after --, it runs the example {}, which is not there (it is "
        "built beside dtrain in build/bin); give the job: dtrain chaos --schedule kill:30s -- "
        "dtrain run -n 4 --max-restarts 100 -- ./train",
        trainer.string()));
  std::vector<std::string> job = {self.string(), "run", "-n", std::to_string(ranks), "--live"};
  job.insert(job.end(), {"--replace", "1000000"});  // as many as the faults kill
  job.insert(job.end(), {"--", trainer.string(), "--epochs", "4", "--threads", "1"});
  return job;
}

}  // namespace

CLI::App* add_chaos_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "chaos",
      "Run a job under a seeded fault schedule and once without, and say what the faults "
      "cost it");
  cmd->footer(
      "\nThe job is a `dtrain run` command (after --). Faults hit workers found through their "
      "flight-record beats; times count from the job's first trained sample. Samples lost and "
      "repeated are counted from the sample log a job writes to DTRAIN_SAMPLE_LOG (the example "
      "does). Last line: CHAOS {json}. Exit status: 0 when every run ended well, 1 otherwise.");
  auto args = std::make_shared<ChaosArgs>();
  cmd->add_option("--schedule", args->schedule,
                  "Faults: kill:EVERY (SIGKILL a random worker every EVERY), stop:EVERY:FOR "
                  "(SIGSTOP one for FOR), disk:EVERY:FOR (fill the file system of --fill-dir for "
                  "FOR), cut:EVERY:FOR (cut a random worker's host off the network for FOR: a "
                  "job on emulated hosts, scripts/netns-hosts.sh job), store:EVERY (SIGKILL the "
                  "host of the job's store), comma-separated: kill:30s,stop:90s:5s")
      ->required();
  cmd->add_option("--seed", args->seed, "Draws which worker each fault hits");
  cmd->add_option("--max-faults", args->max_faults,
                  "Stop injecting after this many faults (default: as long as the job runs)")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--ranks", args->ranks, "Workers of the default job (no job given)")
      ->check(CLI::Range(1, 256));
  cmd->add_flag("--no-baseline", args->no_baseline,
                "Skip the run without faults (no goodput and no samples lost or repeated then)");
  cmd->add_option("--dir", args->dir,
                  "Where each run's output, flight records and sample log go (default: "
                  "$TMPDIR/dtrain-chaos-<pid>, kept)");
  cmd->add_option("--fill-dir", args->fill_dir,
                  "Disk faults fill this directory's file system (where the job writes its "
                  "checkpoints); {run} in the job's command stands for the run's name "
                  "(baseline, faults), to keep the runs' checkpoints apart");
  cmd->add_option("--timeout", args->timeout_s, "Seconds each run may take before it is stopped")
      ->check(CLI::Range(int64_t{1}, int64_t{7 * 86400}));
  cmd->add_option("command", args->command, "The job: a dtrain run command line");
  cmd->positionals_at_end();
  cmd->allow_extras();
  cmd->callback([args, cmd] {
    for (const auto& extra : cmd->remaining())
      if (extra != "--")
        throw InvalidArgumentError(fmt::format(
            "dtrain chaos: unknown option '{}' (see dtrain chaos --help; put the job after --)",
            extra));
    launch::ChaosOptions o;
    try {
      o.schedule = launch::parse_fault_schedule(args->schedule);
    } catch (const InvalidArgumentError& e) {
      throw InvalidArgumentError(std::string("dtrain chaos: ") + e.what());
    }
    o.seed = args->seed;
    o.max_faults = args->max_faults;
    o.baseline = !args->no_baseline;
    o.timeout = std::chrono::seconds(args->timeout_s);
    o.command = args->command.empty() ? default_job(args->ranks) : args->command;
    o.dir = args->dir;
    o.fill_dir = args->fill_dir;
    if (o.dir.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      o.dir = fmt::format("{}/dtrain-chaos-{}", tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                          ::getpid());
    }
    const launch::ChaosReport report = launch::run_chaos(o);
    fmt::print("{}\n", launch::chaos_line(report));
    std::fflush(stdout);
    const bool ok =
        report.faults.exit_code == 0 && (!report.baseline || report.baseline->exit_code == 0);
    if (!ok) throw CLI::RuntimeError(1);
  });
  return cmd;
}

}  // namespace dtrain::tools
