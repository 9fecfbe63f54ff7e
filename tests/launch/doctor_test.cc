// `dtrain run` and `dtrain doctor` on jobs with a fault in them (fault_worker.cc): a rank that
// skips a collective, one stuck in compute, ranks calling collectives in another order, a
// send/recv deadlock, a rank 3x slower than the rest. With DTRAIN_HANG_SECONDS=10 the launcher
// names the right rank and call within 15 s of the hang and stops the job (exit 124); `dtrain
// doctor` reads the same records again, as text and as JSON. The elastic agent does the same
// for each round. Plus records it must refuse.
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "command.h"
#include "support/temp_dir.h"

namespace dtrain::testing {
namespace {

using json = nlohmann::json;

const std::string kBin = DTRAIN_BIN_DIR;

struct Job {
  CommandResult run;
  std::string dir;  // the flight records
};

Job run_faulty(const std::string& fault, int ranks, const TempDir& dir, int steps = 10,
               const std::string& backend = "native") {
  Job job;
  job.dir = dir.path + "/flight";
  job.run =
      run_command({kBin + "/dtrain", "run", "-n", std::to_string(ranks), "--",
                   kBin + "/fault_worker", "--fault", fault, "--steps", std::to_string(steps)},
                  {.env = {{"DTRAIN_HANG_SECONDS", "10"},
                           {"DTRAIN_FLIGHT_DIR", job.dir},
                           {"DTRAIN_BACKEND", backend}},
                   .timeout = std::chrono::seconds(120)});
  return job;
}

json doctor_json(const std::string& dir, int expected_exit) {
  auto r = run_command({kBin + "/dtrain", "doctor", dir, "--json"});
  EXPECT_EQ(r.exit_code, expected_exit) << r.output;
  return json::parse(r.output.substr(r.output.find('{')));
}

// The hang is at step 6, about 0.1 s after the job starts; the workers start in about 1 s.
constexpr double kNamedWithin = 1 + 10 + 15;

TEST(Doctor, ARankStuckInComputeIsNamedWithTheCollectiveTheOthersWaitIn) {
  TempDir dir;
  const Job job = run_faulty("compute", 3, dir);
  EXPECT_EQ(job.run.exit_code, 124) << job.run.output;
  EXPECT_LT(job.run.seconds, kNamedWithin) << job.run.output;
  const std::string& out = job.run.output;
  EXPECT_NE(out.find("no rank has completed a call for 10"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1 never entered collective #6 of group world, "
                     "all_reduce(f32, 256, sum), in which ranks 0, 2 have waited"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("rank 1: it has made no call for"), std::string::npos) << out;
  // Where it is: its thread's C++ stack, in a sleep.
  EXPECT_NE(out.find("nanosleep", out.find("rank 1: it has made no call")), std::string::npos)
      << out;
  const json d = doctor_json(job.dir, 1);
  ASSERT_FALSE(d["findings"].empty()) << d.dump(1);
  EXPECT_EQ(d["findings"][0]["kind"], "never_entered");
  EXPECT_EQ(d["findings"][0]["ranks"], json::array({1}));
  EXPECT_EQ(d["findings"][0]["seq"], 6);
  EXPECT_EQ(d["records"].size(), 3u);
}

// The other backends' groups are recorded by a wrapper (comm/recorded_process_group.h): the same
// diagnosis on gloo.
TEST(Doctor, ARankStuckInComputeIsNamedOnTheGlooBackendToo) {
#ifndef DTRAIN_HAVE_GLOO
  GTEST_SKIP() << "the gloo backend is not built (libgloo-dev)";
#endif
  TempDir dir;
  const Job job = run_faulty("compute", 2, dir, 10, "gloo");
  EXPECT_EQ(job.run.exit_code, 124) << job.run.output;
  EXPECT_LT(job.run.seconds, kNamedWithin) << job.run.output;
  EXPECT_NE(job.run.output.find("rank 1 never entered collective #6 of group world, "
                                "all_reduce(f32, 256, sum), in which rank 0 has waited"),
            std::string::npos)
      << job.run.output;
  EXPECT_NE(job.run.output.find("rank 1: it has made no call for"), std::string::npos)
      << job.run.output;
}

TEST(Doctor, ARankThatSkipsACollectiveIsNamedWithWhatItWaitsInInstead) {
  TempDir dir;
  const Job job = run_faulty("skip", 2, dir);
  EXPECT_EQ(job.run.exit_code, 124) << job.run.output;
  EXPECT_LT(job.run.seconds, kNamedWithin) << job.run.output;
  EXPECT_NE(job.run.output.find("rank 1 never entered collective #6 of group world"),
            std::string::npos)
      << job.run.output;
  EXPECT_NE(job.run.output.find("rank 1: it waits in recv(1024 bytes from rank 0, tag 7)"),
            std::string::npos)
      << job.run.output;
}

TEST(Doctor, RanksCallingCollectivesInAnotherOrderFailAtOnceAndTheFirstDifferenceIsNamed) {
  TempDir dir;
  const Job job = run_faulty("order", 3, dir);
  EXPECT_EQ(job.run.exit_code, 1) << job.run.output;
  EXPECT_LT(job.run.seconds, kNamedWithin) << job.run.output;
  // The launcher prints the diagnosis of the records the failure wrote, after its summary.
  // Each side with the code that made the call: the program and the offset in it, which
  // `addr2line -e fault_worker 0x...` turns into a line.
  EXPECT_NE(job.run.output.find("The ranks disagree at collective #6 of group world: ranks 0, 2 "
                                "called all_reduce(f32, 256, sum) from fault_worker +0x"),
            std::string::npos)
      << job.run.output;
  EXPECT_NE(
      job.run.output.find("; rank 1 called broadcast(f32, 256, root 0) from fault_worker +0x"),
      std::string::npos)
      << job.run.output;
  const json d = doctor_json(job.dir, 1);
  EXPECT_EQ(d["findings"][0]["kind"], "mismatch");
  EXPECT_EQ(d["findings"][0]["ranks"], json::array({1}));
}

TEST(Doctor, ASendRecvDeadlockIsNamedAsACycle) {
  TempDir dir;
  const Job job = run_faulty("p2p", 2, dir);
  EXPECT_EQ(job.run.exit_code, 124) << job.run.output;
  EXPECT_LT(job.run.seconds, kNamedWithin) << job.run.output;
  EXPECT_NE(job.run.output.find("Point-to-point deadlock: rank 0 waits in recv(1024 bytes from "
                                "rank 1, tag 0)"),
            std::string::npos)
      << job.run.output;
  EXPECT_NE(job.run.output.find("rank 1 waits in recv(1024 bytes from rank 0, tag 0)"),
            std::string::npos)
      << job.run.output;
  const json d = doctor_json(job.dir, 1);
  EXPECT_EQ(d["findings"][0]["kind"], "deadlock");
  EXPECT_EQ(d["findings"][0]["ranks"], json::array({0, 1}));
}

TEST(Doctor, ARankThreeTimesSlowerIsNamedWhileTheJobRunsAndInItsRecords) {
  TempDir dir;
  // About 13 s of steps: one 10 s window of the launcher's slow-rank check.
  const Job job = run_faulty("slow", 3, dir, 420);
  EXPECT_EQ(job.run.exit_code, 0) << job.run.output;
  EXPECT_NE(job.run.output.find("dtrain run: rank 1 is slow: "), std::string::npos)
      << job.run.output;
  EXPECT_EQ(job.run.output.find("is slow", job.run.output.find("is slow") + 1), std::string::npos)
      << "named once: " << job.run.output;
  EXPECT_EQ(job.run.output.find("no rank has completed"), std::string::npos) << job.run.output;
}

TEST(Doctor, TheRecordsOfARunningJobNameTheSlowRankByHowMuch) {
  TempDir dir;
  const std::string flight = dir.path + "/flight";
  // SIGUSR2 to the launcher: every worker writes its record, and the job goes on.
  auto job =
      run_command({"sh", "-c",
                   fmt::format("{0}/dtrain run -n 3 -- {0}/fault_worker --fault slow --steps 200 & "
                               "sleep 4; kill -USR2 $!; wait $!",
                               kBin)},
                  {.env = {{"DTRAIN_FLIGHT_DIR", flight}}, .timeout = std::chrono::seconds(60)});
  EXPECT_EQ(job.exit_code, 0) << job.output;
  const json d = doctor_json(flight, 1);
  ASSERT_EQ(d["findings"].size(), 1u) << d.dump(1);
  EXPECT_EQ(d["findings"][0]["kind"], "slow");
  EXPECT_EQ(d["findings"][0]["ranks"], json::array({1}));
  const std::string text = d["findings"][0]["text"];
  // 30 ms against 10 ms of compute a step: about 3x the others' time outside collectives.
  const double factor = std::stod(text.substr(text.find("slow: ") + 6));
  EXPECT_GT(factor, 2.0) << text;
  EXPECT_LT(factor, 4.5) << text;
}

TEST(Doctor, AHealthyJobRunsToItsEndWithNoWordFromTheMonitor) {
  TempDir dir;
  const Job job = run_faulty("none", 2, dir);
  EXPECT_EQ(job.run.exit_code, 0) << job.run.output;
  EXPECT_NE(job.run.output.find("DONE 10 steps"), std::string::npos) << job.run.output;
  EXPECT_EQ(job.run.output.find("dtrain doctor"), std::string::npos) << job.run.output;
}

// A worker whose collective fails writes a failure record for the launcher (comm/failure_record.h):
// the ranks that went silent. The others' words say nothing here ("step failed"): the records
// alone let `dtrain run` name the rank stuck in compute, still running, as the cause, not the
// first rank to exit.
TEST(Doctor, TheFailureRecordsNameTheStuckRankWhenTheWorkersSayNothing) {
  TempDir dir;
  const std::string flight = dir.path + "/flight";
  const auto run = run_command(
      {kBin + "/dtrain", "run", "-n", "3", "--grace-period", "0.5", "--", kBin + "/fault_worker",
       "--fault", "compute", "--say-little"},
      {.env = {{"DTRAIN_TIMEOUT", "3"},
               {"DTRAIN_HANG_SECONDS", "600"},
               {"DTRAIN_LOG_LEVEL", "off"},
               {"DTRAIN_FLIGHT_DIR", flight}},
       .timeout = std::chrono::seconds(120)});
  const std::string& out = run.output;
  EXPECT_EQ(run.exit_code, 1) << out;
  EXPECT_EQ(out.find("timed out"), std::string::npos) << "the workers were to say nothing: " << out;
  EXPECT_NE(out.find("dtrain run: rank 1 (pid "), std::string::npos) << out;
  EXPECT_NE(out.find("did not answer its peers (stopped or stuck"), std::string::npos) << out;
  // Ranks 0 and 2 each timed out, or one was told of the other's timeout first (a peer
  // failure): either way both name rank 1 as silent.
  int timed_out = 0;
  for (int rank : {0, 2}) {
    std::ifstream in(fmt::format("{}/rank{}.error", flight, rank));
    const json record = json::parse(in, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(record.is_object()) << flight << "/rank" << rank << ".error";
    EXPECT_EQ(record["rank"], rank);
    EXPECT_EQ(record["silent"], json::array({1})) << record;
    EXPECT_EQ(record["peer_caused"], record["kind"] == "peer failure") << record;
    EXPECT_NE(record["what"].get<std::string>().find("all_reduce(f32, 256, sum)"),
              std::string::npos)
        << record;
    timed_out += record["kind"] == "timeout";
  }
  EXPECT_GE(timed_out, 1);
  EXPECT_FALSE(std::filesystem::exists(flight + "/rank1.error")) << "rank 1 never failed";
}

// The elastic agent watches its rounds as `dtrain run` watches a job: a stuck round is
// diagnosed, its workers stopped and the round counted as a failure; its records stay in a
// directory of their own while the next round runs. Out of restarts, the job ends as stuck.
TEST(Doctor, AnElasticRunDiagnosesAStuckRoundRestartsItAndEndsAsStuck) {
  TempDir dir;
  const std::string flight = dir.path + "/flight";
  const auto run =
      run_command({kBin + "/dtrain", "run", "-n", "2", "--max-restarts", "1", "--grace-period", "1",
                   "--", kBin + "/fault_worker", "--fault", "compute", "--steps", "10"},
                  {.env = {{"DTRAIN_HANG_SECONDS", "3"}, {"DTRAIN_FLIGHT_DIR", flight}},
                   .timeout = std::chrono::seconds(120)});
  EXPECT_EQ(run.exit_code, 124) << run.output;
  const std::string& out = run.output;
  for (int round : {0, 1}) {
    const std::string records = fmt::format("{}/round{}", flight, round);
    EXPECT_NE(out.find(fmt::format("dtrain doctor: 2 records (ranks 0, 1) in {}", records)),
              std::string::npos)
        << out;
    EXPECT_TRUE(std::filesystem::exists(records + "/rank1.json")) << records;
    EXPECT_NE(out.find(fmt::format("round {} stopped after", round)), std::string::npos) << out;
  }
  EXPECT_NE(out.find("rank 1 never entered collective #6 of group world"), std::string::npos)
      << out;
  EXPECT_NE(out.find("were stuck: no rank completed a call for 3 s while some waited in one "
                     "(DTRAIN_HANG_SECONDS); flight records in " +
                     flight + "/round0; restart 1 of 1 (--max-restarts)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("that is failure 2, more than --max-restarts 1: the job ends"),
            std::string::npos)
      << out;
}

TEST(Doctor, RefusesADirectoryWithoutRecordsAndACutRecordNamingTheFile) {
  TempDir dir;
  auto empty = run_command({kBin + "/dtrain", "doctor", dir.path});
  EXPECT_EQ(empty.exit_code, 2) << empty.output;
  EXPECT_NE(empty.output.find("no flight records (rank<R>.json) in " + dir.path), std::string::npos)
      << empty.output;
  std::ofstream(dir.path + "/rank0.json")
      << R"({"format": "dtrain-flight-1", "rank": 0, "calls": [)";
  auto cut = run_command({kBin + "/dtrain", "doctor", dir.path});
  EXPECT_EQ(cut.exit_code, 2) << cut.output;
  EXPECT_NE(cut.output.find(dir.path + "/rank0.json is not a whole flight record"),
            std::string::npos)
      << cut.output;
  std::ofstream(dir.path + "/rank0.json") << R"({"format": "something-else"})";
  auto other = run_command({kBin + "/dtrain", "doctor", dir.path});
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_NE(other.output.find("is not a dtrain flight record (format something-else"),
            std::string::npos)
      << other.output;
}

}  // namespace
}  // namespace dtrain::testing
