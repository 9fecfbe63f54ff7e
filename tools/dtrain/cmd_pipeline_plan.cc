// `dtrain pipeline-plan`: a pipeline schedule, verified offline, drawn and measured.
//   dtrain pipeline-plan --schedule 1f1b --stages 4 --microbatches 8
//   dtrain pipeline-plan --schedule interleaved-1f1b --stages 4 --microbatches 8 --virtual-stages 2
//   --svg plan.svg dtrain pipeline-plan --check my_schedule.json
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/pipeline/chart.h"
#include "dtrain/pipeline/schedule.h"
#include "dtrain/pipeline/verifier.h"
#include "tools/dtrain/commands.h"

namespace dtrain::tools {
namespace {

struct PlanFlags {
  pipeline::ScheduleOptions schedule;
  pipeline::Costs costs;
  std::string check, svg, trace, json;
  bool quiet = false;
};

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out)
    throw std::runtime_error(
        fmt::format("dtrain pipeline-plan: writing {} failed: {}", path, std::strerror(errno)));
}

void check_cost(const char* flag, double v) {
  if (!std::isfinite(v) || v < 0 || v > 1e9)
    throw std::runtime_error(
        fmt::format("dtrain pipeline-plan: {} is {}; give a finite number from 0 to 1e9", flag, v));
}

void run_plan(const PlanFlags& f) {
  check_cost("--cost-forward", f.costs.forward);
  check_cost("--cost-backward-input", f.costs.backward_input);
  check_cost("--cost-backward-weight", f.costs.backward_weight);
  check_cost("--transfer", f.costs.transfer);
  pipeline::Schedule s;
  if (!f.check.empty()) {
    std::ifstream in(f.check, std::ios::binary);
    if (!in)
      throw std::runtime_error(
          fmt::format("dtrain pipeline-plan: cannot read {}: {}", f.check, std::strerror(errno)));
    std::stringstream text;
    text << in.rdbuf();
    s = pipeline::schedule_from_json(text.str());
  } else {
    s = pipeline::make_schedule(f.schedule);
  }
  const pipeline::ScheduleReport report = pipeline::verify(s, f.costs);
  // A schedule without a split backward runs B and W as one pass: say what that pass costs.
  const auto& c = f.costs;
  const std::string costs =
      s.split_backward()
          ? fmt::format("F {:g}, B {:g}, W {:g}", c.forward, c.backward_input, c.backward_weight)
          : fmt::format("F {:g}, B {:g} (a whole backward: input {:g} + weight {:g})", c.forward,
                        c.backward_input + c.backward_weight, c.backward_input, c.backward_weight);
  std::printf(
      "schedule %s: %d ranks x %d stage%s per rank = %d stages, %d micro-batches; "
      "costs %s, transfer %g\n",
      s.name.c_str(), s.ranks, s.virtual_stages, s.virtual_stages > 1 ? "s" : "", s.stages(),
      s.microbatches, costs.c_str(), c.transfer);
  if (!report.ok) {
    std::fprintf(stderr, "dtrain pipeline-plan: the schedule is wrong: %s\n", report.error.c_str());
    std::exit(1);
  }
  if (!f.quiet) std::fputs(pipeline::text_chart(s, report).c_str(), stdout);
  std::printf("makespan %g; busy per rank %g of it\n", report.makespan,
              report.busy.empty() ? 0.0 : report.busy[0]);
  std::printf("peak micro-batches held per rank: %s\n",
              fmt::format("{}", fmt::join(report.peak_microbatches, " ")).c_str());
  std::printf("bubble %.3f\n", report.bubble);
  if (!f.svg.empty()) write_file(f.svg, pipeline::svg_chart(s, report));
  if (!f.trace.empty()) write_file(f.trace, pipeline::chrome_trace(s, report));
  if (!f.json.empty()) write_file(f.json, pipeline::to_json(s));
}

}  // namespace

CLI::App* add_pipeline_plan_command(CLI::App& app) {
  auto f = std::make_shared<PlanFlags>();
  CLI::App* cmd = app.add_subcommand(
      "pipeline-plan",
      "Verify a pipeline schedule offline (every send received, no deadlock) and print its "
      "timeline, bubble and memory (`dtrain docs pipeline`)");
  std::string names;
  for (const auto& s : pipeline::registered_schedules())
    names += fmt::format("\n  {:<17} {}", s.name, s.summary);
  cmd->add_option("--schedule", f->schedule.name, "The schedule:" + names)->capture_default_str();
  cmd->add_option("--stages", f->schedule.ranks, "Pipeline ranks (p)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--microbatches", f->schedule.microbatches, "Micro-batches per step (m)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--virtual-stages", f->schedule.virtual_stages,
                  "Stages per rank (v), for interleaved-1f1b")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--cost-forward", f->costs.forward, "Time of a forward")->capture_default_str();
  cmd->add_option("--cost-backward-input", f->costs.backward_input,
                  "Time of a backward's input gradient (B)")
      ->capture_default_str();
  cmd->add_option("--cost-backward-weight", f->costs.backward_weight,
                  "Time of a backward's weight gradient (W); a whole backward costs B + W")
      ->capture_default_str();
  cmd->add_option("--transfer", f->costs.transfer, "Time from a send to its receive")
      ->capture_default_str();
  cmd->add_option("--check", f->check,
                  "Verify the schedule in this JSON file (as --json writes it) instead");
  cmd->add_option("--svg", f->svg, "Also write the timeline as SVG to this file");
  cmd->add_option("--trace", f->trace,
                  "Also write the timeline in Chrome's trace format (Perfetto)");
  cmd->add_option("--json", f->json, "Also write the schedule's actions as JSON");
  cmd->add_flag("--quiet", f->quiet, "Print the figures without the chart");
  cmd->callback([f] { run_plan(*f); });
  return cmd;
}

}  // namespace dtrain::tools
