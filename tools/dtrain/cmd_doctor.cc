// `dtrain doctor DIR [--json]`: reads every rank's flight record in DIR (written on a failure, a
// timeout, SIGUSR2, or by `dtrain run` when it finds the job stuck) and says what went wrong:
// the ranks that never entered a collective the others wait in, the first call where ranks
// disagree, point-to-point deadlocks, a slow rank, ranks with no record. Exit status: 0 when
// nothing is wrong, 1 when something is, 2 when DIR holds no readable records.
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dtrain/error.h"
#include "launch/doctor.h"
#include "tools/dtrain/commands.h"

namespace dtrain::tools {

CLI::App* add_doctor_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "doctor", "Read every rank's flight record and say why a job hangs, fails or is slow");
  cmd->footer(
      "\nRecords are in DTRAIN_FLIGHT_DIR (dtrain run sets it and prints it; else "
      "$TMPDIR/dtrain-flight). Send SIGUSR2 to a running worker to dump its record.\n"
      "Exit status: 0 nothing wrong, 1 something wrong (each finding printed), 2 no readable "
      "records.");
  auto dir = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  cmd->add_option("DIR", *dir, "The directory of rank<R>.json records")->required();
  cmd->add_flag("--json", *as_json, "Print the diagnosis as JSON (for tools)");
  cmd->callback([dir, as_json] {
    std::vector<launch::RankRecord> records;
    try {
      records = launch::read_flight_records(*dir);
    } catch (const Error& e) {
      fmt::print(stderr, "{}\n", e.what());
      throw CLI::RuntimeError(2);
    }
    const launch::Diagnosis d = launch::diagnose(records);
    if (*as_json)
      fmt::print("{}\n", launch::to_json(d, records).dump(1));
    else
      fmt::print("{}", launch::describe(d, records, *dir));
    if (!d.healthy()) throw CLI::RuntimeError(1);
  });
  return cmd;
}

}  // namespace dtrain::tools
