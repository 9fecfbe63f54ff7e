// `dtrain sched-sim`: replay a cluster's job trace under scheduling and placement policies
// (docs/scheduling.md).
//   dtrain sched-sim                    # Pollux's workload 6 under Tiresias: its baseline
//   dtrain sched-sim --policy tiresias workloads/workload-6.csv   # Pollux's baseline: 3,469.7 s
//   dtrain sched-sim --policy all --placement all --interference 0.25 --svg jct.svg W.csv
//   dtrain sched-sim --policy all --nodes 64 --cluster 6214e9 --hours 24 philly.csv

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "scheduling/application.h"
#include "scheduling/report.h"
#include "scheduling/simulator.h"
#include "scheduling/workload.h"
#include "tools/dtrain/commands.h"
#include "tools/dtrain/share_dir.h"

#ifndef DTRAIN_SOURCE_DATA_DIR
#define DTRAIN_SOURCE_DATA_DIR ""
#endif

namespace dtrain::tools {
namespace {
namespace fs = std::filesystem;
using namespace dtrain::scheduling;

struct SimFlags {
  std::vector<std::string> workloads;
  std::string policies = "tiresias", placements = "spread";
  SimulationOptions sim;
  double demote_gpu_hours = 16, max_hours = 365 * 24;
  WorkloadOptions selection;
  std::string traces, json, svg;
  std::string gpu_models;  // MODEL:NODES:SPEED,... (replaces --nodes)
};

// --gpu-models v100:8:1.0,k80:8:0.4: groups of nodes, fastest first (pack and spread take the
// lowest-numbered node among equals, so the first group is tried first).
void describe_models(const std::string& text, ClusterSpec& c) {
  c.nodes = 0;
  std::stringstream in(text);
  for (std::string group; std::getline(in, group, ',');) {
    std::smatch m;
    if (!std::regex_match(group, m, std::regex(R"(([A-Za-z0-9_.-]+):(\d{1,6}):([0-9.]+))")))
      throw std::runtime_error(fmt::format(
          "dtrain sched-sim: --gpu-models '{}' should read MODEL:NODES:SPEED (v100:8:1.0)", group));
    const int nodes = std::stoi(m[2]);
    const double speed = std::stod(m[3]);
    if (nodes < 1 || !(speed > 0))
      throw std::runtime_error(fmt::format(
          "dtrain sched-sim: --gpu-models '{}' needs at least one node and a speed above 0",
          group));
    c.nodes += nodes;
    c.node_model.insert(c.node_model.end(), nodes, m[1]);
    c.node_speed.insert(c.node_speed.end(), nodes, speed);
  }
}

// Pollux's traces: installed beside the tool (share/dtrain/pollux), else the source tree's.
std::string default_traces() {
  return share_dir("pollux", "applications.csv", DTRAIN_SOURCE_DATA_DIR);
}

std::vector<std::string> split_list(const std::string& text, const std::vector<std::string>& all) {
  if (text == "all") return all;
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out)
    throw std::runtime_error(
        fmt::format("dtrain sched-sim: writing {} failed: {}", path, std::strerror(errno)));
}

void run_sim(SimFlags f) {
  if (!f.gpu_models.empty()) describe_models(f.gpu_models, f.sim.cluster);
  f.sim.policy_options.demote_gpu_seconds = f.demote_gpu_hours * 3600;
  f.sim.max_seconds = f.max_hours * 3600;
  const auto policies = split_list(f.policies, policy_names());
  std::vector<Placement> placements;
  for (const auto& p : split_list(f.placements, {"pack", "spread", "auto"}))
    placements.push_back(placement_from_string(p));
  for (const auto& p : policies) make_policy(p);  // an unknown name fails before any work
  if (policies.empty() || placements.empty())
    throw std::runtime_error("dtrain sched-sim: give at least one --policy and one --placement");

  if (f.workloads.empty()) {
    f.workloads = {(fs::path(f.traces) / "workloads/workload-6.csv").string()};
    std::printf("no workload given: replaying Pollux's workload 6 (%s)\n", f.workloads[0].c_str());
  }
  // A path that is not here may be one of Pollux's, relative to where dtrain keeps them
  // (workloads-2.0/workload-3.csv), installed or in the source tree.
  for (auto& w : f.workloads) {
    if (fs::exists(w)) continue;
    if (fs::exists(fs::path(f.traces) / w)) {
      w = (fs::path(f.traces) / w).string();
      continue;
    }
    throw std::runtime_error(fmt::format(
        "dtrain sched-sim: workload '{}' does not exist, here or under {} (Pollux's are "
        "workloads/workload-1.csv .. workload-8.csv, and the same under workloads-0.5, "
        "workloads-1.5 and workloads-2.0)",
        w, f.traces));
  }
  std::vector<std::vector<JobSpec>> workloads;
  bool needs_apps = false;
  for (const auto& w : f.workloads) {
    workloads.push_back(read_workload(w, f.selection));
    for (const auto& j : workloads.back()) needs_apps |= !j.application.empty();
  }
  bool rigid = false;
  for (const auto& w : workloads)
    for (const auto& j : w) rigid |= j.application.empty();
  if (rigid && f.sim.cross_rack_slowdown != 1)
    std::fprintf(stderr,
                 "dtrain sched-sim: note: --cross-rack-slowdown slows application jobs only; the "
                 "rigid jobs of a job table have no measured synchronization time\n");
  std::map<std::string, Application> apps;
  if (needs_apps) {
    if (f.traces.empty() || !fs::exists(fs::path(f.traces) / "applications.csv"))
      throw std::runtime_error(fmt::format(
          "dtrain sched-sim: the workload names applications but '{}' has no applications.csv; "
          "give --traces DIR (dtrain's copy of Pollux's traces is data/pollux)",
          f.traces));
    apps = load_applications((fs::path(f.traces) / "traces").string(),
                             (fs::path(f.traces) / "applications.csv").string());
  }
  const ClusterSpec& c = f.sim.cluster;
  std::printf(
      "cluster: %d nodes x %d GPUs%s; interval %g s, restart %g s, interference %g, "
      "share slowdown %g, cross-rack sync x%g\n",
      c.nodes, c.gpus_per_node,
      (c.nodes_per_rack > 0 ? fmt::format(", {} nodes per rack", c.nodes_per_rack) : "")
          .append(f.gpu_models.empty() ? "" : " (" + f.gpu_models + ")")
          .c_str(),
      f.sim.interval, f.sim.restart_seconds, f.sim.interference, f.sim.share_slowdown,
      f.sim.cross_rack_slowdown);
  std::vector<SimulationResult> all;
  std::map<std::string, std::vector<double>> averages;  // by policy/placement, over workloads
  for (size_t w = 0; w < workloads.size(); ++w) {
    std::vector<SimulationResult> results;
    for (const auto& p : policies)
      for (Placement where : placements) {
        SimulationOptions o = f.sim;
        o.policy = p;
        o.placement = where;
        results.push_back(simulate(workloads[w], apps, o));
        averages[results.back().policy + "/" + results.back().placement].push_back(
            results.back().average_jct());
      }
    std::printf("\n%s: %zu jobs\n%s", f.workloads[w].c_str(), workloads[w].size(),
                format_table(results).c_str());
    all.insert(all.end(), results.begin(), results.end());
  }
  if (workloads.size() > 1) {
    std::printf("\nmean of the average JCTs over %zu workloads:\n", workloads.size());
    for (const auto& [label, v] : averages) {
      double sum = 0;
      for (double a : v) sum += a;
      std::printf("  %-18s %10.1f s\n", label.c_str(), sum / v.size());
    }
  }
  if (!f.json.empty()) write_file(f.json, to_json(all));
  if (!f.svg.empty()) write_file(f.svg, svg_jct_cdf(all));
}

}  // namespace

CLI::App* add_sched_sim_command(CLI::App& app) {
  auto f = std::make_shared<SimFlags>();
  f->traces = default_traces();
  CLI::App* cmd = app.add_subcommand(
      "sched-sim",
      "Replay a GPU cluster's job trace under scheduling and placement policies: JCT, makespan, "
      "utilization, queueing (`dtrain docs scheduling`)");
  cmd->add_option("workload", f->workloads,
                  "Workload CSV files: Pollux's (name,time,application,num_replicas,batch_size; "
                  "its own by their path under --traces, e.g. workloads/workload-6.csv, the "
                  "default) or a job table ((timestamp|time),num_gpus,duration, e.g. philly.csv)");
  cmd->add_option("--policy", f->policies, "fifo, srtf, tiresias, a comma list, or all")
      ->capture_default_str();
  cmd->add_option("--placement", f->placements, "pack, spread, auto, a comma list, or all")
      ->capture_default_str();
  cmd->add_option("--nodes", f->sim.cluster.nodes, "Nodes in the cluster")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--gpus-per-node", f->sim.cluster.gpus_per_node, "GPUs per node")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--gpu-models", f->gpu_models,
                  "Groups of nodes by GPU model, MODEL:NODES:SPEED,... (speed relative to the "
                  "traces' GPUs; a job runs at its slowest node's); replaces --nodes");
  cmd->add_option("--nodes-per-rack", f->sim.cluster.nodes_per_rack, "Nodes per rack (0: one rack)")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  cmd->add_option("--interval", f->sim.interval, "Seconds between scheduling decisions")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 86400.0));
  cmd->add_option("--restart", f->sim.restart_seconds, "Seconds a job pauses when its GPUs change")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_option("--interference", f->sim.interference,
                  "Slowdown of a multi-node job that shares a node with another, in [0, 1)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.99));
  cmd->add_option("--share-slowdown", f->sim.share_slowdown,
                  "Slowdown of any job that shares a node with another, in [0, 1)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.99));
  cmd->add_option("--cross-rack-slowdown", f->sim.cross_rack_slowdown,
                  "Factor on the synchronization time of a job that spans racks")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1000.0));
  cmd->add_option("--auto-load", f->sim.auto_load,
                  "auto placement packs once active jobs ask for this share of the GPUs")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 100.0));
  cmd->add_option("--demote-gpu-hours", f->demote_gpu_hours,
                  "tiresias: GPU-hours in the first queue")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 1e6));
  cmd->add_option("--max-hours", f->max_hours,
                  "Simulated hours after which unfinished jobs are an error")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1e6));
  cmd->add_option("--traces", f->traces, "Folder with applications.csv and traces/APP/ (Pollux's)")
      ->capture_default_str();
  cmd->add_option("--cluster", f->selection.cluster,
                  "Job tables: only this 'cluster' column value");
  cmd->add_option("--start", f->selection.start,
                  "Job tables: from this time (YYYY-MM-DD[ HH:MM:SS], UTC)");
  cmd->add_option("--hours", f->selection.hours,
                  "Job tables: this many hours from --start (0: all)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--min-duration", f->selection.min_duration,
                  "Job tables: leave out jobs shorter than this (s)")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--json", f->json, "Also write every job's times as JSON");
  cmd->add_option("--svg", f->svg, "Also draw the JCT distributions as SVG");
  cmd->callback([f] { run_sim(*f); });
  return cmd;
}

}  // namespace dtrain::tools
