// Every registered schedule, for 1-4 ranks and several micro-batch counts: the verifier proves it
// ends, each micro-batch passes every stage once, and its bubble and memory are the ones its file
// states.
#include "dtrain/pipeline/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/pipeline/verifier.h"

namespace dtrain::pipeline {
namespace {

struct Case {
  std::string name;
  int p, m, v;
};

std::vector<Case> every_case() {
  std::vector<Case> out;
  for (const auto& info : registered_schedules())
    for (int p = 1; p <= 4; ++p)
      for (int m : {1, 2, 3, 4, 5, 8, 13})
        for (int v : info.interleaved ? std::vector<int>{1, 2, 3} : std::vector<int>{1})
          out.push_back({info.name, p, m, v});
  return out;
}

TEST(Schedules, EveryScheduleVerifies) {
  for (const Case& c : every_case()) {
    SCOPED_TRACE(fmt::format("{} p={} m={} v={}", c.name, c.p, c.m, c.v));
    Schedule s = make_schedule({.name = c.name, .ranks = c.p, .microbatches = c.m,
                                .virtual_stages = c.v});
    ScheduleReport r = verify(s);
    ASSERT_TRUE(r.ok) << r.error;
    // Each pass of each (stage, micro-batch) appears once, on the stage's rank.
    for (int rank = 0; rank < c.p; ++rank) {
      int forwards = 0;
      for (const Action& a : s.actions[rank]) {
        EXPECT_EQ(s.rank_of(a.stage), rank);
        forwards += a.op == Op::kForward;
      }
      EXPECT_EQ(forwards, c.m * c.v);
    }
    EXPECT_GE(r.bubble, 0);
    EXPECT_LT(r.bubble, 1);
  }
}

double bubble_of(const std::string& name, int p, int m, int v = 1) {
  return check(make_schedule({.name = name, .ranks = p, .microbatches = m, .virtual_stages = v}))
      .bubble;
}

TEST(Schedules, BubblesAreTheTheoreticalOnes) {
  for (int p = 1; p <= 8; ++p) {
    for (int m : {1, 2, 4, 8, 16, 32}) {
      SCOPED_TRACE(fmt::format("p={} m={}", p, m));
      const double one = double(p - 1) / (m + p - 1);
      EXPECT_NEAR(bubble_of("gpipe", p, m), one, 1e-12);
      EXPECT_NEAR(bubble_of("1f1b", p, m), one, 1e-12);
      if (m >= p)  // the paper's case; with fewer micro-batches than ranks there is less to fill
        EXPECT_NEAR(bubble_of("zb-h1", p, m), double(p - 1) / (3 * m + p - 1), 1e-12);
      EXPECT_LE(bubble_of("zb-h1", p, m), one + 1e-12);
      if (m % p != 0) continue;  // Megatron's condition; other counts may wait longer (the file)
      for (int v : {2, 4})
        EXPECT_NEAR(bubble_of("interleaved-1f1b", p, m, v), double(p - 1) / (v * m + p - 1), 1e-12)
            << "v=" << v;
    }
  }
}

TEST(Schedules, MemoryIsEachSchedulesBound) {
  const int p = 4, m = 8;
  auto peak = [&](const std::string& name, int v = 1) {
    return check(make_schedule({.name = name, .ranks = p, .microbatches = m, .virtual_stages = v}))
        .peak_microbatches;
  };
  EXPECT_EQ(peak("gpipe"), (std::vector<int>{8, 8, 8, 8}));
  EXPECT_EQ(peak("1f1b"), (std::vector<int>{4, 3, 2, 1}));
  EXPECT_EQ(peak("zb-h1"), (std::vector<int>{4, 4, 4, 4}));
  // Megatron's warm-up plus one: (p-r-1)*2 + (v-1)*p + 1 chunk micro-batches.
  EXPECT_EQ(peak("interleaved-1f1b", 2), (std::vector<int>{11, 9, 7, 5}));
}

TEST(Schedules, SplitBackwardOnlyInZeroBubble) {
  for (const auto& info : registered_schedules()) {
    Schedule s = make_schedule({.name = info.name, .ranks = 3, .microbatches = 4});
    EXPECT_EQ(s.split_backward(), info.name == "zb-h1") << info.name;
  }
}

TEST(Schedules, OptionsThatDoNotFitAreRefusedByName) {
  auto message = [](const ScheduleOptions& o) {
    try {
      make_schedule(o);
    } catch (const InvalidArgumentError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message({.name = "2f2b"}).find("'2f2b' is unknown; the schedules are gpipe, 1f1b"),
            std::string::npos);
  EXPECT_NE(message({.name = "1f1b", .ranks = 0}).find("0 ranks"), std::string::npos);
  EXPECT_NE(message({.name = "gpipe", .microbatches = 0}).find("0 micro-batches"),
            std::string::npos);
  EXPECT_NE(message({.name = "1f1b", .virtual_stages = 2}).find("need an interleaved schedule"),
            std::string::npos);
}

TEST(Schedules, JsonRoundTrip) {
  Schedule s = make_schedule({.name = "interleaved-1f1b", .ranks = 3, .microbatches = 5,
                              .virtual_stages = 2});
  Schedule back = schedule_from_json(to_json(s));
  EXPECT_EQ(back.name, s.name);
  EXPECT_EQ(back.ranks, 3);
  EXPECT_EQ(back.virtual_stages, 2);
  EXPECT_EQ(back.microbatches, 5);
  EXPECT_EQ(back.actions, s.actions);
}

// torch's V-shaped schedules (ZBVZeroBubble): rank r holds stages r and 2p-1-r, and their lists
// name compute passes only; the transfers are placed as make_schedule places them, a stage's
// output to the next one on the same rank included.
TEST(Schedules, APlacedScheduleOfComputePassesGetsItsTransfers) {
  const std::string text = R"({"schedule":"v","ranks":2,"virtual_stages":2,"microbatches":1,
    "placement":[0,1,1,0],"actions":[
    [{"op":"forward","stage":0,"microbatch":0},{"op":"forward","stage":3,"microbatch":0},
     {"op":"backward","stage":3,"microbatch":0},{"op":"backward","stage":0,"microbatch":0}],
    [{"op":"forward","stage":1,"microbatch":0},{"op":"forward","stage":2,"microbatch":0},
     {"op":"backward","stage":2,"microbatch":0},{"op":"backward","stage":1,"microbatch":0}]]})";
  Schedule s = schedule_from_json(text);
  EXPECT_EQ(s.placement, (std::vector<int>{0, 1, 1, 0}));
  EXPECT_EQ(s.rank_of(3), 0);
  EXPECT_EQ(s.stages_of(1), (std::vector<int>{1, 2}));
  const std::vector<Action> rank1 = {
      {Op::kRecvActivation, 1, 0}, {Op::kForward, 1, 0},       {Op::kSendActivation, 1, 0},
      {Op::kRecvActivation, 2, 0}, {Op::kForward, 2, 0},       {Op::kSendActivation, 2, 0},
      {Op::kRecvGradient, 2, 0},   {Op::kBackward, 2, 0},      {Op::kSendGradient, 2, 0},
      {Op::kRecvGradient, 1, 0},   {Op::kBackward, 1, 0},      {Op::kSendGradient, 1, 0}};
  EXPECT_EQ(s.actions[1], rank1);
  EXPECT_EQ(schedule_from_json(to_json(s)).placement, s.placement);
}

TEST(Schedules, MalformedJsonIsNamed) {
  auto message = [](const std::string& text) {
    try {
      schedule_from_json(text);
    } catch (const InvalidArgumentError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message("{").find("not JSON"), std::string::npos);
  EXPECT_NE(message(R"({"schedule":"x","ranks":2,"virtual_stages":1,"microbatches":1,"placement":[0,0],"actions":[[],[]]})")
                .find("the placement gives rank 0 2 stages; each holds 1"),
            std::string::npos);
  EXPECT_NE(message(R"({"schedule":"x","ranks":2,"virtual_stages":1,"microbatches":1,"placement":[0,2],"actions":[[],[]]})")
                .find("the placement of stage 1 has rank 2"),
            std::string::npos);
  EXPECT_NE(message(R"({"schedule":"x","ranks":1e300,"virtual_stages":1,"microbatches":1,"actions":[[]]})")
                .find("ranks"),
            std::string::npos);
  EXPECT_NE(message(R"({"schedule":"x","ranks":1,"virtual_stages":1,"microbatches":1,"actions":[[{"op":"jump","stage":0,"microbatch":0}]]})")
                .find("action 0 of rank 0 has op \"jump\""),
            std::string::npos);
  EXPECT_NE(message(R"({"schedule":"x","ranks":1,"virtual_stages":1,"microbatches":2,"actions":[[{"op":"forward","stage":0,"microbatch":7}]]})")
                .find("microbatch 7"),
            std::string::npos);
  EXPECT_NE(message(R"({"schedule":"x","ranks":2,"virtual_stages":1,"microbatches":1,"actions":[[]]})")
                .find("a list of 2 lists"),
            std::string::npos);
}

}  // namespace
}  // namespace dtrain::pipeline
