// Live recovery (issue #48) with dtrain::LiveWorld under `dtrain run --live`, over live_worker:
// the survivors re-form their group without a rank that died (rank 0 too: the store is the
// launcher's) and their all-reduces sum exactly the members left; a replacement (--replace) is
// taken in at a step boundary, or told it came too late; a program that does not re-form fails
// the job as before; outside a launcher's store LiveWorld says what it needs.
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "command.h"
#include "launch/cpu_binding.h"
#include "support/multiproc.h"

namespace dtrain::testing {
namespace {

const std::string kDtrain = std::string(DTRAIN_BIN_DIR) + "/dtrain";
const std::string kWorker = std::string(DTRAIN_BIN_DIR) + "/live_worker";

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

void survivors_go_on_without(int dead) {
  const auto r = run_command({kDtrain, "run", "-n", "3", "--live", "--", kWorker, "--steps", "100",
                              "--die-rank", std::to_string(dead), "--die-at", "30"},
                             {.timeout = std::chrono::milliseconds(60'000)});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  const std::string members = dead == 0 ? "1,2" : dead == 1 ? "0,2" : "0,1";
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_NE(r.output.find("generation 1 rank " + std::to_string(rank) + " of 2 members " +
                            members + " lost " + std::to_string(dead)),
              std::string::npos)
        << r.output;
  EXPECT_EQ(count(r.output, "DONE steps 100 generation 1 world 2 checked 100"), 2u) << r.output;
  EXPECT_NE(r.output.find("rank " + std::to_string(dead) + " (pid "), std::string::npos);
  EXPECT_NE(r.output.find("was killed by SIGKILL (Killed); the other workers go on without it "
                          "(--live)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("2 worker(s) ended well; 1 lost along the way (--live)"),
            std::string::npos)
      << r.output;
}

TEST(LiveWorld, TheSurvivorsReformWithoutADeadRankAndSumExactlyTheMembersLeft) {
  survivors_go_on_without(1);
}

TEST(LiveWorld, TheSurvivorsGoOnWhenRankZeroDiesSinceTheStoreIsTheLaunchers) {
  survivors_go_on_without(0);
}

TEST(LiveWorld, AMemberThatDiesAfterTheListClosedIsLeftOutWhenItsGroupDoesNotForm) {
  // Rank 3 dies at step 30; rank 2 is listed for generation 1 and dies before it connects. The
  // other two give up on generation 1 within the settle time (3 s) and agree on generation 2.
  const auto r = run_command({kDtrain, "run", "-n", "4", "--live", "--", kWorker, "--steps", "100",
                              "--die-rank", "3", "--die-at", "30", "--die-in-reform", "2"},
                             {.timeout = std::chrono::milliseconds(60'000)});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  EXPECT_NE(r.output.find("rank 2 at start: listed for generation 1, dying before its group "
                          "connects"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("generation 1's group did not form"), std::string::npos) << r.output;
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_NE(
        r.output.find("generation 2 rank " + std::to_string(rank) + " of 2 members 0,1 lost 3,2"),
        std::string::npos)
        << r.output;
  EXPECT_EQ(count(r.output, "DONE steps 100 generation 2 world 2 checked 100"), 2u) << r.output;
  EXPECT_NE(r.output.find("2 worker(s) ended well; 2 lost along the way (--live)"),
            std::string::npos)
      << r.output;
}

TEST(LiveWorld, ARankThatComesAfterTheListClosedIsRefusedAndTakenInAgainWithTheMembersState) {
  // Rank 3 dies at step 30; rank 2 re-forms 4.5 s late (stopped or cut off meanwhile): ranks 0
  // and 1 leave it out after the settle time (3 s) and train on, then take it in again at a step
  // boundary, where it goes on from their step (the sums check every member's step).
  const auto r = run_command(
      {kDtrain, "run", "-n", "4", "--live", "--", kWorker, "--steps", "150", "--step-ms", "40",
       "--die-rank", "3", "--die-at", "30", "--late-rank", "2", "--late-ms", "4500"},
      {.timeout = std::chrono::milliseconds(60'000)});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_NE(
        r.output.find("generation 1 rank " + std::to_string(rank) + " of 2 members 0,1 lost 2,3"),
        std::string::npos)
        << r.output;
  EXPECT_NE(r.output.find("rank 2 at start was left out of generation 1: it announced itself "
                          "after the others had closed the list"),
            std::string::npos)
      << r.output;
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_NE(
        r.output.find("generation 2 rank " + std::to_string(rank) + " of 3 members 0,1,2 joined 2"),
        std::string::npos)
        << r.output;
  EXPECT_NE(r.output.find("generation 2 rank 2 of 3 members 0,1,2 rejoined"), std::string::npos)
      << r.output;
  EXPECT_EQ(count(r.output, "DONE steps 150 generation 2 world 3 checked"), 3u) << r.output;
  EXPECT_NE(r.output.find("3 worker(s) ended well; 1 lost along the way (--live)"),
            std::string::npos)
      << r.output;
}

TEST(LiveWorld, AReplacementIsTakenInAtAStepBoundaryAndTheWorldIsWholeAgain) {
  const auto r = run_command({kDtrain, "run", "-n", "3", "--live", "--replace", "1", "--", kWorker,
                              "--steps", "400", "--die-rank", "1", "--die-at", "30"},
                             {.timeout = std::chrono::milliseconds(60'000)});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  EXPECT_NE(r.output.find("started a replacement for rank 1 (pid"), std::string::npos) << r.output;
  // The members make generation 2 with it, in its place by rank at start; its all-reduces sum
  // all three from then on.
  for (int rank : {0, 2})
    EXPECT_NE(
        r.output.find("generation 2 rank " + std::to_string(rank) + " of 3 members 0,1,2 joined 1"),
        std::string::npos)
        << r.output;
  EXPECT_NE(r.output.find("replacement 1: rank 1 of 3 in generation 2 from step "),
            std::string::npos)
      << r.output;
  EXPECT_EQ(count(r.output, "DONE steps 400 generation 2 world 3 checked"), 3u) << r.output;
  EXPECT_NE(r.output.find("3 worker(s) ended well; 1 lost along the way (--live)"),
            std::string::npos)
      << r.output;
}

TEST(LiveWorld, AReplacementThatComesAfterTrainingEndedHasNothingToDo) {
  // Rank 1 dies at the last step: the others finish without it and close the world, and its
  // replacement, taken in or not in time, never waits for a step that will not come.
  const auto r = run_command({kDtrain, "run", "-n", "3", "--live", "--replace", "1", "--", kWorker,
                              "--steps", "60", "--die-rank", "1", "--die-at", "59"},
                             {.timeout = std::chrono::milliseconds(60'000)});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  const bool in_time = count(r.output, "DONE steps 60 generation 2 world 3") == 3;
  EXPECT_TRUE(in_time ||
              r.output.find("replacement 1: too late, nothing to do") != std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("3 worker(s) ended well; 1 lost along the way (--live)"),
            std::string::npos)
      << r.output;
}

TEST(LiveWorld, ASpareTakesADeadWorkersPlaceAtOnceAndANewOneWaitsForTheNext) {
  const auto r =
      run_command({kDtrain, "run", "-n", "3", "--live", "--spares", "1", "--replace", "1", "--",
                   kWorker, "--steps", "400", "--die-rank", "1", "--die-at", "30"},
                  {.timeout = std::chrono::milliseconds(60'000)});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  EXPECT_NE(r.output.find("spare 1 (pid "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(") takes the place of rank 1; the others take it in at a step boundary"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("started spare 2 (pid "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("started a replacement"), std::string::npos) << r.output;
  // The spare is rank 1 now, in its output too; the members take it in as they would a
  // replacement.
  EXPECT_NE(r.output.find("[rank 1] replacement 1: rank 1 of 3 in generation 2 from step "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(" (spare 1)"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("still getting ready"), std::string::npos) << r.output;  // it was ready
  EXPECT_EQ(count(r.output, "DONE steps 400 generation 2 world 3 checked"), 3u) << r.output;
  // The second spare learns that training is over and ends well, counted as no worker.
  EXPECT_NE(r.output.find("[spare 2] spare 2: not needed, nothing to do"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("3 worker(s) ended well; 1 lost along the way (--live)"),
            std::string::npos)
      << r.output;
}

// A spare still getting ready when a worker died takes the place late, and says so: how long the
// place waited, and why a spare may not be ready.
TEST(LiveWorld, ASpareNotReadyWhenGivenItsPlaceSaysHowLongThePlaceWaited) {
  const auto r = run_command({kDtrain, "run", "-n", "2", "--live", "--spares", "1", "--", kWorker,
                              "--steps", "1000", "--die-rank", "1", "--die-at", "10",
                              "--spare-start-ms", "2000"},
                             {.timeout = std::chrono::milliseconds(60'000)});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  static const std::regex late(
      "live world: spare 1 takes the place of rank 1 at start ([0-9.]+) s after its launcher gave "
      "it: the spare was still getting ready");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, late)) << r.output;
  EXPECT_GT(std::stod(m[1]), 1.0) << r.output;  // it slept 2 s from the job's start
  EXPECT_NE(r.output.find("leave a CPU to the spares"), std::string::npos) << r.output;
  EXPECT_EQ(count(r.output, "DONE steps 1000 generation 2 world 2"), 2u) << r.output;
}

// Where each worker is bound to its share of the CPUs, a spare waits bound to none and is bound
// to the dead worker's share when it takes its place.
TEST(LiveWorld, ASpareInABoundWorkersPlaceIsBoundToItsCpus) {
  const std::vector<int> cpus = launch::allowed_cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "two workers are bound only with two CPUs or more";
  const auto r =
      run_command({kDtrain, "run", "-n", "2", "--live", "--spares", "1", "--", kWorker, "--steps",
                   "200", "--die-rank", "1", "--die-at", "30"},
                  {.timeout = std::chrono::milliseconds(60'000)});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  ASSERT_NE(r.output.find(") takes the place of rank 1"), std::string::npos) << r.output;
  for (int rank : {0, 1}) {
    const std::string line = fmt::format("[rank {}] DONE steps 200 generation ", rank);
    const size_t at = r.output.find(line);
    ASSERT_NE(at, std::string::npos) << r.output;
    const std::string done = r.output.substr(at, r.output.find('\n', at) - at);
    const std::string share = launch::describe_cpus(launch::cpu_share(rank, 2, cpus));
    EXPECT_TRUE(done.ends_with(" cpus " + share)) << done << "\n" << r.output;
  }
}

TEST(LiveWorld, SparesThatWereNotNeededEndWithTheJob) {
  const auto r = run_command(
      {kDtrain, "run", "-n", "2", "--live", "--spares", "2", "--", kWorker, "--steps", "40"},
      {.timeout = std::chrono::milliseconds(60'000)});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  EXPECT_EQ(count(r.output, "DONE steps 40 generation 0 world 2 checked"), 2u) << r.output;
  EXPECT_EQ(count(r.output, ": not needed, nothing to do"), 2u) << r.output;
}

TEST(LiveWorld, ReplacementsAndSparesNeedLive) {
  for (const auto& [flag, says] :
       {std::pair{"--replace",
                  "--replace starts workers in dead ones' places while the others go on: it needs "
                  "--live"},
        {"--spares",
         "--spares starts workers that wait to take dead ones' places while the others go on: it "
         "needs --live"}}) {
    const auto r = run_command({kDtrain, "run", "-n", "2", flag, "1", "--", kWorker});
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << r.output;
  }
}

TEST(LiveWorld, AProgramThatDoesNotReformFailsTheJobNamingTheDeadRank) {
  const auto r = run_command({kDtrain, "run", "-n", "3", "--live", "--", kWorker, "--die-rank", "2",
                              "--die-at", "10", "--no-reform", "1"},
                             {.timeout = std::chrono::milliseconds(60'000)});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 2 (pid"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("ended well"), std::string::npos) << r.output;
}

TEST(LiveWorld, OutsideALaunchersStoreItSaysWhatItNeeds) {
  const auto r = run_command({kWorker}, {.env = {{"RANK", "0"},
                                                 {"WORLD_SIZE", "1"},
                                                 {"MASTER_ADDR", "127.0.0.1"},
                                                 {"MASTER_PORT", std::to_string(free_port())}}});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("live recovery needs a store that outlives every worker, hosted by the "
                          "launcher: run the job under `dtrain run --live`"),
            std::string::npos)
      << r.output;
}

TEST(LiveWorld, LiveIsRefusedWhereItCannotKeepTheSurvivors) {
  const auto r =
      run_command({kDtrain, "run", "-n", "2", "--live", "--max-restarts", "1", "--", kWorker});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--live keeps the surviving workers running; it cannot be combined "
                          "with an elastic run"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace dtrain::testing
