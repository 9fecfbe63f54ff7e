// The verifier rejects corrupted schedules, naming the rank, the action's index and the action;
// `dtrain pipeline-plan` prints the figures, writes the pictures and refuses bad schedules.
#include "dtrain/pipeline/verifier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "dtrain/pipeline/schedule.h"
#include "launch/command.h"

namespace dtrain::pipeline {
namespace {

namespace fs = std::filesystem;

size_t index_of(const Schedule& s, int rank, const Action& a) {
  const auto& list = s.actions[rank];
  auto it = std::find(list.begin(), list.end(), a);
  EXPECT_NE(it, list.end()) << describe(a);
  return static_cast<size_t>(it - list.begin());
}

void erase(Schedule& s, int rank, const Action& a) {
  s.actions[rank].erase(s.actions[rank].begin() + index_of(s, rank, a));
}

std::string error_of(const Schedule& s) {
  ScheduleReport r = verify(s);
  EXPECT_FALSE(r.ok);
  return r.error;
}

TEST(Verifier, AForwardWithoutItsReceiveIsNamed) {
  Schedule s = make_schedule({.name = "1f1b", .ranks = 2, .microbatches = 4});
  erase(s, 1, {Op::kRecvActivation, 1, 2});
  const size_t at = index_of(s, 1, {Op::kForward, 1, 2});
  EXPECT_EQ(error_of(s), fmt::format("rank 1, action {} (F2 of stage 1): its input has not been "
                                     "received (no recv_activation before it)",
                                     at));
}

TEST(Verifier, AMissingSendIsNamed) {
  Schedule s = make_schedule({.name = "gpipe", .ranks = 3, .microbatches = 3});
  erase(s, 0, {Op::kSendActivation, 0, 2});
  const size_t at = index_of(s, 1, {Op::kRecvActivation, 1, 2});
  EXPECT_EQ(error_of(s), fmt::format("a receive has no send: rank 1, action {} (recv activation 2 "
                                     "of stage 1 from stage 0) waits for which rank 0 never "
                                     "sends (a missing message); 2 other ranks wait behind it",
                                     at));
}

TEST(Verifier, ADeadlockNamesBothRanksAndWhatEachWaitsFor) {
  // GPipe's order on rank 1, 1F1B-without-warm-up on rank 0: rank 0 waits for micro-batch 0's
  // gradient before sending micro-batch 1, which rank 1 needs before its first backward.
  Schedule s = make_schedule({.name = "gpipe", .ranks = 2, .microbatches = 2});
  auto& r0 = s.actions[0];
  const std::vector<Action> block = {{Op::kRecvGradient, 0, 0}, {Op::kBackward, 0, 0}};
  erase(s, 0, block[0]);
  erase(s, 0, block[1]);
  r0.insert(r0.begin() + index_of(s, 0, {Op::kSendActivation, 0, 0}) + 1, block.begin(),
            block.end());
  const std::string e = error_of(s);
  EXPECT_EQ(e.rfind("deadlock: rank 0, action 2 (recv gradient 0 of stage 0 from stage 1) waits "
                    "for which rank 1 sends at its action ",
                    0),
            0u)
      << e;
  EXPECT_NE(e.find("where it waits; rank 1, action 2 (recv activation 1 of stage 1 from stage 0) "
                   "waits for which rank 0 sends at its action 5, after its action 2"),
            std::string::npos)
      << e;
}

TEST(Verifier, PassesOutOfPlaceAreNamed) {
  Schedule twice = make_schedule({.name = "1f1b", .ranks = 1, .microbatches = 2});
  twice.actions[0].push_back({Op::kForward, 0, 1});
  EXPECT_EQ(error_of(twice), "rank 0, action 4 (F1 of stage 0): the forward runs twice");

  Schedule elsewhere = make_schedule({.name = "1f1b", .ranks = 2, .microbatches = 1});
  elsewhere.actions[0].insert(elsewhere.actions[0].begin(), {Op::kForward, 1, 0});
  EXPECT_EQ(error_of(elsewhere), "rank 0, action 0 (F0 of stage 1): stage 1 lives on rank 1");

  Schedule early = make_schedule({.name = "zb-h1", .ranks = 1, .microbatches = 1});
  std::swap(early.actions[0][1], early.actions[0][2]);  // W before its B
  EXPECT_EQ(error_of(early), "rank 0, action 1 (W0 of stage 0): its backward_input has not run");

  Schedule twice_back = make_schedule({.name = "zb-h1", .ranks = 1, .microbatches = 2});
  twice_back.actions[0].push_back({Op::kBackward, 0, 1});
  EXPECT_EQ(error_of(twice_back), "rank 0, action 6 (B1 of stage 0): the backward runs twice");

  // Whole or split is each pass's choice (torch's DualPipeV mixes them), but a whole backward
  // leaves no weight gradient to compute.
  Schedule mixed = make_schedule({.name = "zb-h1", .ranks = 1, .microbatches = 2});
  std::erase(mixed.actions[0], Action{Op::kBackwardWeight, 0, 1});
  std::replace(mixed.actions[0].begin(), mixed.actions[0].end(), Action{Op::kBackwardInput, 0, 1},
               Action{Op::kBackward, 0, 1});
  EXPECT_TRUE(verify(mixed).ok) << verify(mixed).error;
  mixed.actions[0].push_back({Op::kBackwardWeight, 0, 1});
  EXPECT_EQ(error_of(mixed),
            "rank 0, action 5 (W1 of stage 0): its backward was whole (backward), which computed "
            "the weight gradient");

  Schedule missing = make_schedule({.name = "gpipe", .ranks = 1, .microbatches = 2});
  missing.actions[0].pop_back();
  EXPECT_EQ(error_of(missing), "rank 0 never runs the backward of micro-batch 1 of stage 0");
}

TEST(Verifier, ASendNobodyReceivesIsNamed) {
  Schedule s = make_schedule({.name = "gpipe", .ranks = 2, .microbatches = 1});
  s.actions[1].clear();  // rank 1 does nothing; rank 0 sends, then waits for the gradient
  EXPECT_NE(error_of(s).find("rank 1 never sends (a missing message)"), std::string::npos);
}

TEST(Verifier, CostsShapeTheTimeline) {
  // 1F1B on 2 ranks, 2 micro-batches, F = 1, B + W = 3. Rank 1: F0 1-2, B0 2-5, F1 5-6, B1 6-9;
  // rank 0: F0 0-1, F1 1-2, B0 5-8 (its gradient came at 5), B1 9-12.
  Schedule s = make_schedule({.name = "1f1b", .ranks = 2, .microbatches = 2});
  ScheduleReport r = check(s, {.forward = 1, .backward_input = 2, .backward_weight = 1});
  EXPECT_DOUBLE_EQ(r.makespan, 12);
  EXPECT_DOUBLE_EQ(r.busy[0], 8);
  EXPECT_DOUBLE_EQ(r.busy[1], 8);
  EXPECT_NEAR(r.bubble, 1 - 16.0 / 24, 1e-12);
  ScheduleReport slow = check(s, {.transfer = 0.5});
  EXPECT_GT(slow.makespan, check(s).makespan);
}

// `dtrain pipeline-plan`, run as a user would.
const std::string kDtrain = std::string(DTRAIN_BIN_DIR) + "/dtrain";

testing::CommandResult dtrain(std::vector<std::string> args) {
  args.insert(args.begin(), kDtrain);
  return testing::run_command(args);
}

TEST(PipelinePlan, PrintsTheChartAndTheBubbleOnALineOfItsOwn) {
  auto r = dtrain({"pipeline-plan", "--schedule", "1f1b", "--stages", "4", "--microbatches", "8"});
  ASSERT_TRUE(r.ok()) << r.describe() << r.output;
  EXPECT_NE(r.output.find("\nbubble 0.273\n"), std::string::npos) << r.output;
  // One backward (B + W, two units) is one label and a dash, not two labels.
  EXPECT_NE(r.output.find("rank 3 | .  .  .  F0 B0 -- F1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("costs F 1, B 2 (a whole backward: input 1 + weight 1), transfer 0"),
            std::string::npos)
      << r.output;
  // With a split backward, B and W are passes of their own.
  auto z = dtrain({"pipeline-plan", "--schedule", "zb-h1", "--stages", "2", "--microbatches", "2"});
  ASSERT_TRUE(z.ok()) << z.output;
  EXPECT_NE(z.output.find("costs F 1, B 1, W 1, transfer 0"), std::string::npos) << z.output;
  EXPECT_NE(r.output.find("peak micro-batches held per rank: 4 3 2 1"), std::string::npos);

  auto i = dtrain({"pipeline-plan", "--schedule", "interleaved-1f1b", "--stages", "4",
                   "--microbatches", "8", "--virtual-stages", "2", "--quiet"});
  ASSERT_TRUE(i.ok()) << i.output;
  EXPECT_NE(i.output.find("\nbubble 0.158\n"), std::string::npos) << i.output;
}

TEST(PipelinePlan, WritesSvgTraceAndJsonAndChecksAnEditedSchedule) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("plan-{}", ::getpid());
  fs::create_directories(dir);
  auto r = dtrain({"pipeline-plan", "--schedule", "zb-h1", "--stages", "3", "--microbatches", "4",
                   "--svg", (dir / "p.svg").string(), "--trace", (dir / "p.json").string(),
                   "--json", (dir / "s.json").string()});
  ASSERT_TRUE(r.ok()) << r.output;
  auto read = [](const fs::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  EXPECT_EQ(read(dir / "p.svg").rfind("<svg", 0), 0u);
  auto trace = nlohmann::json::parse(read(dir / "p.json"));
  int passes = 0;
  for (const auto& e : trace["traceEvents"]) passes += e["ph"] == "X";
  EXPECT_EQ(passes, 3 * 4 * 3);  // F, B and W of 4 micro-batches on 3 stages

  // The written schedule verifies as it is; with a receive removed it is refused, named.
  auto again = dtrain({"pipeline-plan", "--check", (dir / "s.json").string(), "--quiet"});
  ASSERT_TRUE(again.ok()) << again.output;
  auto j = nlohmann::json::parse(read(dir / "s.json"));
  auto& rank1 = j["actions"][1];
  for (size_t k = 0; k < rank1.size(); ++k) {
    if (rank1[k]["op"] == "recv_activation") {
      rank1.erase(k);
      break;
    }
  }
  std::ofstream(dir / "bad.json") << j.dump();
  auto bad = dtrain({"pipeline-plan", "--check", (dir / "bad.json").string()});
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("the schedule is wrong: rank 1, action 0 (F0 of stage 1): its input "
                            "has not been received"),
            std::string::npos)
      << bad.output;
  fs::remove_all(dir);
}

TEST(PipelinePlan, RefusesBadNumbers) {
  auto nan = dtrain({"pipeline-plan", "--cost-forward", "nan"});
  EXPECT_NE(nan.exit_code, 0);
  EXPECT_NE(nan.output.find("--cost-forward is nan"), std::string::npos) << nan.output;
  auto zero = dtrain({"pipeline-plan", "--stages", "0"});
  EXPECT_NE(zero.exit_code, 0);
  EXPECT_NE(zero.output.find("--stages"), std::string::npos) << zero.output;
  auto v = dtrain({"pipeline-plan", "--schedule", "gpipe", "--virtual-stages", "2"});
  EXPECT_NE(v.exit_code, 0);
  EXPECT_NE(v.output.find("need an interleaved schedule"), std::string::npos) << v.output;
}

}  // namespace
}  // namespace dtrain::pipeline
