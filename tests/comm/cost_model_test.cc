// The cost model's file, its choices on hosts and racks, and `dtrain predict`'s step model (pure
// functions, no network), then `dtrain predict` run as a user runs it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "comm/algorithms/algorithm.h"
#include "comm/cost_model.h"
#include "comm/scaling_model.h"
#include "dtrain/error.h"
#include "launch/command.h"

namespace dtrain::comm {
namespace {

std::string write(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(CostFile, WhatBenchCalibrateWritesReadsBack) {
  CostConstants k;
  k.alpha = 30e-6, k.beta = 1 / 1.1e9, k.alpha_local = 3e-6, k.beta_local = 1 / 9e9;
  k.alpha_rack = 80e-6, k.beta_rack = 1 / 0.3e9, k.gamma = 1 / 20e9, k.call = 45e-6;
  k.beta_machine = 1 / 2.1e9, k.beta_machine_shm = 1 / 3.3e9;
  const auto back = CostModel::read_file(write("calibrated.json", CostModel::to_json(k, "test")));
  EXPECT_NEAR(back.alpha, k.alpha, 1e-12);
  EXPECT_NEAR(back.beta, k.beta, 1e-15);
  EXPECT_NEAR(back.alpha_local, k.alpha_local, 1e-12);
  EXPECT_NEAR(back.beta_rack, k.beta_rack, 1e-15);
  EXPECT_NEAR(back.gamma, k.gamma, 1e-15);
  EXPECT_NEAR(back.call, k.call, 1e-12);
  EXPECT_NEAR(back.beta_machine, k.beta_machine, 1e-15);
  EXPECT_NEAR(back.beta_machine_shm, k.beta_machine_shm, 1e-15);
  // Without one, none: each flow as fast as its link.
  EXPECT_EQ(CostModel::read_file(write("unshared.json", CostModel::to_json(CostConstants{}, "t"))).beta_machine, 0.0);
}

TEST(CostFile, TheOldFlatFormIsTheHostLink) {
  const auto k = CostModel::read_file(write("flat.json", R"({"alpha_us": 20, "beta_gbps": 2, "gamma_gbps": 10})"));
  EXPECT_NEAR(k.alpha, 20e-6, 1e-12);
  EXPECT_NEAR(k.beta, 1 / 2e9, 1e-15);
}

TEST(CostFile, ACorruptFileSaysWhatIsWrongWhere) {
  auto fails_with = [](const std::string& text, const std::string& want) {
    const auto path = write("bad.json", text);
    try {
      CostModel::read_file(path);
      ADD_FAILURE() << "read: " << text;
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  };
  fails_with("{\"links\": {\"host\": {\"alpha_us\": 1", "is not JSON");
  fails_with(R"({"links": {"host": {"alpha_us": -1, "beta_gbps": 1}}})", "'alpha_us' must be a positive number");
  fails_with(R"({"links": {"host": {"alpha_us": 1}}})", "needs alpha_us and beta_gbps");
  fails_with(R"({"links": {"nvlink": {"alpha_us": 1, "beta_gbps": 1}}})", "unknown key 'nvlink'");
  fails_with(R"({"version": 2})", "version 2");
  fails_with(R"({"beta_gbps": "fast"})", "must be a positive number");
  fails_with(R"({"machine_gbps": 0})", "'machine_gbps' must be a positive number");
  fails_with(R"({"machine_shm_gbps": -3})", "'machine_shm_gbps' must be a positive number");
  EXPECT_THROW(CostModel::read_file("/nonexistent/cost.json"), InvalidArgumentError);
}

TEST(CostFile, LoadReportsAProblemInsteadOfThrowing) {
  ::setenv("DTRAIN_COST_FILE", write("bad2.json", "[]").c_str(), 1);
  const auto loaded = CostModel::load();
  ::unsetenv("DTRAIN_COST_FILE");
  EXPECT_NE(loaded.problem.find("must be a JSON object"), std::string::npos) << loaded.problem;
  EXPECT_NEAR(loaded.constants.alpha, CostConstants{}.alpha, 1e-12);  // the defaults stand
}

// 16 hosts of 4 ranks in 4 racks whose uplinks are much slower than the hosts' links.
Topology racked() {
  Topology t;
  t.hosts = 16, t.per_host = 4, t.uniform = true, t.host_contiguous = true;
  t.racks = 4, t.hosts_per_rack = 4, t.spans_racks = true;
  return t;
}

TEST(CostModelChoice, LargeMessagesGoHierarchicalAndASlowUplinkSplitsTheCrossGroupsByRack) {
  CostConstants k;
  k.alpha = 20e-6, k.beta = 1 / 1.2e9, k.alpha_rack = 60e-6, k.beta_rack = 1 / 0.3e9;
  const CostModel model(k);
  const Topology t = racked();
  EXPECT_EQ(model.pick(CollectiveKind::kAllreduce, 64 << 20, 64, t).name, "hierarchical");
  const Topology cross = CostModel::cross_of(t);
  EXPECT_EQ(cross.level, Topology::Level::kRacks);
  EXPECT_EQ(cross.hosts, 4);
  EXPECT_EQ(cross.nic_sharers, 4);
  EXPECT_EQ(model.pick(CollectiveKind::kAllreduce, 16 << 20, 16, cross).name, "hierarchical");
  // Tiny messages across racks: latency rules, the log-step exchange beats a ring.
  EXPECT_LT(model.cost("recursive_doubling", CollectiveKind::kAllreduce, 64, 16, cross),
            model.cost("ring", CollectiveKind::kAllreduce, 64, 16, cross));
  // The same hosts with fast uplinks: nothing to gain from splitting the cross groups again.
  CostConstants flat = k;
  flat.alpha_rack = flat.alpha, flat.beta_rack = flat.beta / 4;
  EXPECT_NE(CostModel(flat).pick(CollectiveKind::kAllreduce, 16 << 20, 16, cross).name, "hierarchical");
}

// Emulated hosts on one machine of two cores (docs/scaling.md): 1.2 GB/s links, and 2.1 GB/s
// through TCP for all the machine's flows together.
TEST(CostModelChoice, HostsOfOneMachineShareWhatItsCoresMove) {
  CostConstants k;
  k.alpha = 14e-6, k.beta = 1 / 1.2e9, k.beta_machine = 1 / 2.1e9;
  const CostModel model(k);
  Topology apart;  // one rank per host: a group that does not split
  Topology shared = apart;
  shared.one_machine = true;
  const size_t M = 64 << 20;
  auto ratio = [&](const char* algo, int n, const Topology& a, const Topology& b) {
    return model.cost(algo, CollectiveKind::kAllreduce, M, n, b) /
           model.cost(algo, CollectiveKind::kAllreduce, M, n, a);
  };
  // The bandwidth term grows by `want`; latency and reduction, unchanged, dilute it a little.
  auto slower_by = [](double got, double want) { return got > 0.85 * want && got <= want; };
  // 8 flows share 2.1 GB/s: each gets 0.26 GB/s, not its link's 1.2.
  EXPECT_PRED2(slower_by, ratio("ring", 8, apart, shared), (8 / 2.1) / (1 / 1.2));
  EXPECT_PRED2(slower_by, ratio("halving_doubling", 8, apart, shared), (8 / 2.1) / (1 / 1.2));
  // 2 flows: 1.05 GB/s each, a little under the link.
  EXPECT_PRED2(slower_by, ratio("ring", 2, apart, shared), (2 / 2.1) / (1 / 1.2));
  // Without a measured machine rate, or on separate machines, nothing changes.
  EXPECT_DOUBLE_EQ(CostModel(CostConstants{}).cost("ring", CollectiveKind::kAllreduce, M, 8, shared),
                   CostModel(CostConstants{}).cost("ring", CollectiveKind::kAllreduce, M, 8, apart));
  // A ring over hosts of consecutive ranks sends one flow per host, not one per rank; the
  // hierarchy's cross groups (one per local index, all at once) share the machine too.
  Topology hosts4x2 = shared;
  hosts4x2.hosts = 4, hosts4x2.per_host = 2, hosts4x2.host_contiguous = true;
  Topology hosts4x2_apart = hosts4x2;
  hosts4x2_apart.one_machine = false;
  EXPECT_PRED2(slower_by, ratio("ring", 8, hosts4x2_apart, hosts4x2), (4 / 2.1) / (1 / 1.2));
  const Topology cross = CostModel::cross_of(hosts4x2);
  EXPECT_TRUE(cross.one_machine);
  EXPECT_EQ(cross.nic_sharers, 2);
  Topology cross_apart = cross;
  cross_apart.one_machine = false;
  EXPECT_PRED2(slower_by, ratio("ring", 4, cross_apart, cross), (4 / 2.1) / (1 / 1.2));
  // The hierarchy's steps inside the hosts run at once on the same cores: where the machine's
  // rate for them was measured, their copies take what it says, not what one pair alone took.
  auto inner = [&](const Topology& t, const CostConstants& c) {
    return CostModel(c).cost("hierarchical", CollectiveKind::kAllreduce, M, 8, t) -
           CostModel(c).best_cost(CollectiveKind::kAllreduce, M / 2, 4, CostModel::cross_of(t));
  };
  CostConstants busy = k;
  busy.beta_local = 1 / 10e9, busy.beta_machine_shm = 1 / 2.5e9;
  CostConstants busy_fast = busy;  // the same but for the copies: what is left is latency and sums
  busy_fast.beta_local = busy_fast.beta_machine_shm = 1e-15;
  const double copies_apart = inner(hosts4x2_apart, busy) - inner(hosts4x2_apart, busy_fast);
  const double copies_shared = inner(hosts4x2, busy) - inner(hosts4x2, busy_fast);
  EXPECT_GT(copies_apart, 0);
  EXPECT_NEAR(copies_shared / copies_apart, 4.0, 1e-3);  // 2.5 GB/s against 10
  // Unmeasured, each host's memory is its own.
  const double unmeasured = inner(hosts4x2, k) - inner(hosts4x2_apart, k);
  EXPECT_NEAR(unmeasured, 0.0, 1e-9);
  // In the cache the hosts share (64 KiB on 8 ranks), the steps cost what one pair measured;
  // at 1 MiB, 8 ranks on the cores of one machine are beyond it.
  auto inner_at = [&](size_t bytes, const Topology& t) {
    return CostModel(busy).cost("hierarchical", CollectiveKind::kAllreduce, bytes, 8, t) -
           CostModel(busy).best_cost(CollectiveKind::kAllreduce, bytes / 2, 4, CostModel::cross_of(t));
  };
  EXPECT_NEAR(inner_at(64 << 10, hosts4x2), inner_at(64 << 10, hosts4x2_apart), 1e-12);
  EXPECT_GT(inner_at(1 << 20, hosts4x2), 2 * inner_at(1 << 20, hosts4x2_apart));
}

TEST(CostModelChoice, UnevenHostsStillSplitButNotForAllGather) {
  const CostModel model;
  Topology t;
  t.hosts = 2, t.per_host = 3, t.uniform = false;
  EXPECT_LT(model.cost("hierarchical", CollectiveKind::kAllreduce, 1 << 20, 4, t), 1e29);
  EXPECT_GE(model.cost("hierarchical", CollectiveKind::kAllgather, 1 << 20, 4, t), 1e29);
  EXPECT_THROW(model.choose(CollectiveKind::kAllgather, "hierarchical", 1 << 20, 4, t), InvalidArgumentError);
}

TEST(StepModel, NoCommunicationOnOneRankAndLessEfficiencyOnSlowerNetworks) {
  StepModel m;
  m.parameters = 25e6;
  m.compute_s = 0.1;
  CostConstants fast, slow;
  fast.beta = 1 / 10e9;
  slow.beta = 1 / 0.1e9;
  const auto one = predict_step(CostModel(fast), m, {1, 1, 0}, "ddp");
  EXPECT_DOUBLE_EQ(one.step_s, 0.1);
  EXPECT_DOUBLE_EQ(one.efficiency, 1.0);
  const auto f = predict_step(CostModel(fast), m, {64, 4, 0}, "ddp-ring");
  const auto s = predict_step(CostModel(slow), m, {64, 4, 0}, "ddp-ring");
  EXPECT_GT(f.efficiency, s.efficiency);
  // 100 MB through 0.1 GB/s twice is 2 s, most of it beyond the backward: efficiency < 10%.
  EXPECT_LT(s.efficiency, 0.1);
  EXPECT_GT(s.comm_s, 1.5);
  // Exposed time is what the step waited for beyond its compute.
  EXPECT_NEAR(s.step_s, m.compute_s + s.exposed_s, 1e-12);
}

TEST(StepModel, LayoutsThatCannotRunOnAShapeSaySo) {
  StepModel m;
  m.parameters = 1e6;
  m.compute_s = 0.01;
  const auto p = predict_step(CostModel(), m, {4, 4, 0}, "ddp-hierarchical");  // one host
  EXPECT_FALSE(p.runs);
  EXPECT_THROW(predict_step(CostModel(), m, {8, 1, 0}, "ps"), InvalidArgumentError);  // no servers
  EXPECT_THROW(predict_step(CostModel(), m, {8, 1, 0}, "zero9"), InvalidArgumentError);
}

TEST(StepModel, MoreServersRelieveTheParameterServer) {
  StepModel m;
  m.parameters = 100e6;
  m.compute_s = 0.2;
  CostConstants k;
  k.beta = 1 / 1.2e9;
  m.ps_servers = 4;
  const auto few = predict_step(CostModel(k), m, {64, 1, 0}, "ps");
  m.ps_servers = 64;
  const auto many = predict_step(CostModel(k), m, {64, 1, 0}, "ps");
  EXPECT_LT(many.step_s, few.step_s);
}

// Every algorithm in the registry is whole, named once for its collective, and priced where it
// can run; the model picks among those alone.
TEST(Registry, EveryAlgorithmIsWholeAndPricedWhereItRuns) {
  const CostModel model;
  Topology one_host;
  one_host.local = true;
  one_host.can_read_all = true;
  Topology hosts;
  hosts.hosts = 2;
  hosts.per_host = 2;
  for (const algo::Algorithm* a : algo::registry()) {
    SCOPED_TRACE(std::string(a->name));
    EXPECT_EQ(algo::find(a->kind, a->name), a) << "a second algorithm of that name";
    EXPECT_NE(a->run, nullptr);
    EXPECT_FALSE(a->file.empty() || a->formula.empty() || a->chosen.empty());
    const Topology& t = a->needs == algo::Needs::kParts || a->needs == algo::Needs::kUniformParts
                            ? hosts
                            : one_host;
    EXPECT_TRUE(algo::unusable(*a, t, 4).empty()) << algo::unusable(*a, t, 4);
    const double c = model.cost(*a, 1 << 20, 4, t);
    EXPECT_GT(c, 0);
    EXPECT_LT(c, 1.0);
  }
  // Those that need more than ranks say so, and cost nothing the model would pick.
  Topology tcp;
  const auto* direct = algo::find(CollectiveKind::kAllreduce, "direct");
  ASSERT_NE(direct, nullptr);
  EXPECT_NE(algo::unusable(*direct, tcp, 4).find("cross-memory attach"), std::string::npos);
  EXPECT_GT(model.cost(*direct, 1 << 20, 4, tcp), 1e20);
  for (size_t bytes : {size_t{8}, size_t{1} << 20, size_t{64} << 20})
    for (CollectiveKind kind : {CollectiveKind::kAllreduce, CollectiveKind::kBroadcast,
                                CollectiveKind::kAllgather})
      EXPECT_TRUE(algo::unusable(model.pick(kind, bytes, 4, tcp), tcp, 4).empty());
  EXPECT_THROW(model.choose(CollectiveKind::kAllreduce, "direct", 1 << 20, 4, tcp),
               InvalidArgumentError);
  EXPECT_THROW(model.choose(CollectiveKind::kAllreduce, "magic", 1 << 20, 4, tcp),
               InvalidArgumentError);
}

const std::string kDtrain = std::string(DTRAIN_BIN_DIR) + "/dtrain";

TEST(PredictCommand, PrintsATableWritesCsvAndSvgAndRefusesBadInput) {
  const std::string dir = ::testing::TempDir();
  const std::string csv = dir + "/predict.csv", svg = dir + "/predict.svg";
  auto r = testing::run_command({kDtrain, "predict", "--params", "44.5M", "--compute-ms", "450",
                                 "--per-host", "4", "--network", "25gbe", "--intra", "nvlink",
                                 "--ranks", "1,4,512", "--layouts", "ddp-ring,ddp-hierarchical,ps",
                                 "--ps-servers", "128", "--csv", csv, "--svg", svg});
  ASSERT_TRUE(r.ok()) << r.output;
  EXPECT_NE(r.output.find("44.5M parameters"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("   512"), std::string::npos) << r.output;
  std::ifstream c(csv);
  std::string header, line;
  std::getline(c, header);
  EXPECT_EQ(header, "ranks,layout,step_ms,comm_ms,exposed_ms,efficiency");
  int rows = 0;
  while (std::getline(c, line)) ++rows;
  EXPECT_EQ(rows, 8);  // hierarchical cannot run with the 4 ranks on one host
  std::ifstream s(svg);
  std::string text((std::istreambuf_iterator<char>(s)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("<svg"), std::string::npos);
  EXPECT_NE(text.find("ddp-hierarchical"), std::string::npos);
  // A calibration file as the network; a corrupt one is named.
  CostConstants k;
  k.beta = 1 / 0.12e9;
  const auto links = write("links.json", CostModel::to_json(k, "test"));
  auto slow = testing::run_command({kDtrain, "predict", "--params", "100M", "--compute-ms", "100",
                                    "--network", links, "--ranks", "16", "--layouts", "ddp-ring"});
  ASSERT_TRUE(slow.ok()) << slow.output;
  EXPECT_NE(slow.output.find("0.12 GB/s"), std::string::npos) << slow.output;
  // The file's measured link inside hosts stands unless --intra names another.
  k.alpha_local = 7e-6;
  k.beta_local = 1 / 3.5e9;
  const auto measured = write("measured.json", CostModel::to_json(k, "test"));
  auto kept = testing::run_command({kDtrain, "predict", "--params", "100M", "--compute-ms", "100",
                                    "--network", measured, "--ranks", "16"});
  ASSERT_TRUE(kept.ok()) << kept.output;
  EXPECT_NE(kept.output.find("inside 7.0 us + 3.5 GB/s"), std::string::npos) << kept.output;
  auto asked = testing::run_command({kDtrain, "predict", "--params", "100M", "--compute-ms",
                                     "100", "--network", measured, "--ranks", "16", "--intra",
                                     "nvlink"});
  ASSERT_TRUE(asked.ok()) << asked.output;
  EXPECT_NE(asked.output.find("inside 5.0 us + 40.0 GB/s"), std::string::npos) << asked.output;
  auto bad = testing::run_command({kDtrain, "predict", "--params", "1M", "--compute-ms", "10",
                                   "--network", write("bad3.json", "{")});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("is not JSON"), std::string::npos) << bad.output;
  auto none = testing::run_command({kDtrain, "predict", "--params", "1M"});
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.output.find("--compute-ms"), std::string::npos) << none.output;
}

// docs/algorithms.md's table is the registry's (`dtrain algorithms --markdown` rewrites it).
TEST(AlgorithmsCommand, DocsTableIsTheRegistrys) {
  auto r = testing::run_command({kDtrain, "algorithms", "--markdown"});
  ASSERT_TRUE(r.ok()) << r.output;
  EXPECT_EQ(r.output, algo::markdown_table());
  std::ifstream f(std::string(DTRAIN_SOURCE_DIR) + "/docs/algorithms.md");
  const std::string doc((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(doc.find(r.output), std::string::npos)
      << "docs/algorithms.md's table is not the registry's: run `dtrain algorithms --markdown` "
         "and put its output there";
}

}  // namespace
}  // namespace dtrain::comm
