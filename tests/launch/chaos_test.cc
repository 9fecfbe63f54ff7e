// `dtrain chaos` (issue #48): the fault schedule it reads and refuses, the clock that fires each
// rule and draws victims from the seed, the sample ledger that keeps each step's latest restart;
// and end to end, the example under SIGKILLs and SIGSTOPs with restarts from its in-memory
// commits (no sample lost or repeated, the baseline's loss), under SIGKILLs with live recovery
// (`dtrain run --live`: the survivors go on within a second, every sample once, from memory or
// from shards; checkpoints written by whichever rank 0 each world has), under a disk
// that fills while it checkpoints (a clear error, nothing lost), and a job that cannot recover.
#include "launch/chaos.h"

#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "command.h"
#include "dtrain/error.h"
#include "launch/fault_schedule.h"
#include "launch/launched.h"
#include "launch/sample_ledger.h"
#include "support/temp_dir.h"

namespace dtrain::launch {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

std::string message_of(const std::string& spec) {
  try {
    parse_fault_schedule(spec);
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "";
}

TEST(FaultSchedule, ReadsEachKindOfFaultAndRefusesWhatItCannotRead) {
  const auto rules = parse_fault_schedule("kill:30s,stop:1.5m:500ms");
  ASSERT_EQ(rules.size(), 2u);
  EXPECT_EQ(rules[0].kind, FaultKind::kKill);
  EXPECT_EQ(rules[0].every, milliseconds(30'000));
  EXPECT_EQ(rules[1].kind, FaultKind::kStop);
  EXPECT_EQ(rules[1].every, milliseconds(90'000));
  EXPECT_EQ(rules[1].lasting, milliseconds(500));

  EXPECT_NE(message_of("").find("--schedule is empty"), std::string::npos);
  EXPECT_NE(message_of("kill:30").find("'30' in 'kill:30' is not a time"), std::string::npos)
      << message_of("kill:30");
  EXPECT_NE(message_of("kill:-3s").find("not a time"), std::string::npos);
  EXPECT_NE(message_of("stop:10s").find("cannot read 'stop:10s'"), std::string::npos);
  EXPECT_NE(message_of("stop:10s:10s").find("must end before the next one begins"),
            std::string::npos);
  const auto disk = parse_fault_schedule("disk:60s:5s");
  ASSERT_EQ(disk.size(), 1u);
  EXPECT_EQ(disk[0].kind, FaultKind::kDisk);
  EXPECT_EQ(disk[0].lasting, milliseconds(5'000));
  EXPECT_NE(message_of("disk:60s").find("cannot read 'disk:60s'"), std::string::npos);
  EXPECT_NE(message_of("kill:30s,boom:1s").find("cannot read 'boom:1s'"), std::string::npos);
  const auto network = parse_fault_schedule("cut:120s:10s,store:300s");
  ASSERT_EQ(network.size(), 2u);
  EXPECT_EQ(network[0].kind, FaultKind::kCut);
  EXPECT_EQ(network[0].every, milliseconds(120'000));
  EXPECT_EQ(network[0].lasting, milliseconds(10'000));
  EXPECT_EQ(network[1].kind, FaultKind::kStore);
  EXPECT_EQ(network[1].every, milliseconds(300'000));
  EXPECT_NE(message_of("cut:120s").find("cannot read 'cut:120s'"), std::string::npos);
  EXPECT_NE(message_of("store:300s:5s").find("cannot read 'store:300s:5s'"), std::string::npos);
}

TEST(FaultClock, FiresEachRuleOnItsOwnClockAndTheSeedDecidesTheVictims) {
  const auto rules = parse_fault_schedule("kill:3s,stop:5s:1s");
  FaultClock clock(rules, 7);
  std::vector<std::pair<FaultKind, int64_t>> fired;
  for (int i = 0; i < 5; ++i) {
    const int64_t at = clock.next().at.count();
    fired.emplace_back(clock.fire().kind, at);
  }
  const std::vector<std::pair<FaultKind, int64_t>> expected = {{FaultKind::kKill, 3000},
                                                               {FaultKind::kStop, 5000},
                                                               {FaultKind::kKill, 6000},
                                                               {FaultKind::kKill, 9000},
                                                               {FaultKind::kStop, 10000}};
  EXPECT_EQ(fired, expected);
  FaultClock a(rules, 7), b(rules, 7), c(rules, 8);
  std::vector<size_t> va, vb, vc;
  for (int i = 0; i < 20; ++i) {
    va.push_back(a.pick(4));
    vb.push_back(b.pick(4));
    vc.push_back(c.pick(4));
  }
  EXPECT_EQ(va, vb);
  EXPECT_NE(va, vc);
  for (size_t v : va) EXPECT_LT(v, 4u);
}

TEST(SampleLedger, KeepsForEachStepTheLatestRestartAndComparesSampleBySample) {
  dtrain::testing::TempDir dir;
  const std::string path = dir.path + "/samples.log";
  {
    std::ofstream out(path);
    // Steps 1-2 in restart 0; step 2 trained again in restart 1 (the commit was of step 1),
    // then step 3; the last line was cut by a kill.
    out << "0 10 1 0\n0 11 1 0\n0 12 2 0\n0 13 2 0\n"
        << "0 12 2 1\n0 13 2 1\n0 14 3 1\n0 15 3 1\n0 16 4";
  }
  const SampleLedger ledger = SampleLedger::read(path);
  EXPECT_EQ(ledger.lines, 8);
  EXPECT_EQ(ledger.steps, 3);
  EXPECT_EQ(ledger.steps_redone, 1);
  for (int64_t i = 10; i <= 15; ++i) EXPECT_EQ(ledger.trained.at({0, i}), 1) << i;

  SampleLedger reference;
  for (int64_t i = 10; i <= 16; ++i) reference.trained[{0, i}] = 1;
  SampleLedger run = ledger;
  run.trained[{0, 10}] = 2;
  const LedgerComparison c = compare_ledgers(run, reference);
  EXPECT_EQ(c.lost, 1);      // sample 16
  EXPECT_EQ(c.repeated, 1);  // sample 10, twice

  {
    std::ofstream out(path);
    out << "0 10 1 0\n0 x 1 0\n0 12 2 0\n";
  }
  try {
    SampleLedger::read(path);
    FAIL() << "a malformed line was read";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("line 2 is '0 x 1 0'"), std::string::npos) << e.what();
  }
}

TEST(GoodputInRun, TakesTheRunsPaceBetweenFaultsAndCountsWhatAFaultCost) {
  // 100 samples a second, logged every 0.1 s for 60 s, none for 3 s from 30 s (a kill there).
  auto run = [](double seconds, double gap_from, double gap_to) {
    std::vector<std::pair<double, int64_t>> progress;
    int64_t lines = 0;
    for (int tick = 1; tick <= static_cast<int>(seconds * 10); ++tick) {
      const double t = tick / 10.0;
      if (t > gap_from && t <= gap_to) continue;
      lines += 10;
      progress.emplace_back(t, lines);
    }
    return progress;
  };
  const auto faulted = run(60, 30, 33);
  ASSERT_EQ(faulted.back().second, 5700);
  const std::vector<std::pair<double, double>> kill{{30, 30}};
  // Both stretches trained 100 samples a second: 5,700 take 57 s of the 59.9 it took.
  EXPECT_NEAR(goodput_in_run(faulted, 5700, kill).value(), 57.0 / 59.9, 1e-9);
  // 100 of the lines were a step trained again: what was trained counts, not what was logged.
  EXPECT_NEAR(goodput_in_run(faulted, 5600, kill).value(), 56.0 / 59.9, 1e-9);
  EXPECT_NEAR(goodput_in_run(run(60, 0, 0), 6000, {}).value(), 60.0 / 59.9, 1e-9);
  // A stop lifted at 40 s: the pace comes from before 30 s and after 45 s.
  const auto stopped = run(70, 30, 40);
  EXPECT_NEAR(goodput_in_run(stopped, 6000, {{30, 40}}).value(), 60.0 / 69.9, 1e-9);
  EXPECT_FALSE(goodput_in_run(run(14, 0, 0), 1400, {}).has_value());  // 8.9 s after settling
  EXPECT_FALSE(goodput_in_run({}, 0, {}).has_value());
}

TEST(GoodputInRun, TellsThePaceOfStepsThatFixedWindowsCannot) {
  // A step every 1.1 s, its 8 samples logged in two lines of 4 a few milliseconds apart (ranks
  // finish at different times); a kill at 40 s costs the step in progress and 1.5 s. A 10-second
  // window holds 9 or 10 steps (7.2 or 8.0 samples/s); the run's pace is 7.27.
  std::vector<std::pair<double, int64_t>> progress;
  int64_t lines = 0;
  double t = 1.1;
  int steps = 0;
  for (; t < 100; t += 1.1) {
    if (t > 40 && t < 40 + 1.1) t += 1.5;  // the kill: its step is logged 1.5 s late
    lines += 4;
    progress.emplace_back(t, lines);
    lines += 4;
    progress.emplace_back(t + 0.004, lines);
    ++steps;
  }
  const double wall = progress.back().first - progress.front().first;
  const int64_t trained = lines;  // nothing logged twice
  EXPECT_NEAR(goodput_in_run(progress, trained, {{40, 40}}).value(), steps * 1.1 / wall, 2e-3);
}

// A job under another launcher (torchrun, or here a shell) writes no beat pages: its workers are
// the processes under it whose environment names a RANK their parent's does not: not the
// launcher, not a worker's own children (`sleep`, which inherits RANK). With `replica_groups`,
// each worker is rank 0 of a replica group of its own (torchft's shape, REPLICA_GROUP_ID), and
// the victim is named by both.
void finds_the_workers_of_another_launcher(bool replica_groups) {
  dtrain::testing::TempDir dir;
  const std::string me = replica_groups ? "$REPLICA_GROUP_ID" : "$RANK";
  const std::string worker = "echo $$ > " + dir.path + "/pid." + me +
                             "; for s in $(seq 1 40); do echo \"0 " + me +
                             " $s 0\" >> \"$DTRAIN_SAMPLE_LOG\"; sleep 0.1; done";
  const std::string job =
      replica_groups ? "REPLICA_GROUP_ID=0 RANK=0 bash -c '" + worker +
                           "' & REPLICA_GROUP_ID=1 RANK=0 bash -c '" + worker + "' & wait"
                     : "RANK=0 bash -c '" + worker + "' & RANK=1 bash -c '" + worker + "' & wait";
  const auto r = dtrain::testing::run_command(
      {std::string(DTRAIN_BIN_DIR) + "/dtrain", "chaos", "--dir", dir.path + "/runs", "--schedule",
       "kill:1s", "--seed", "1", "--max-faults", "1", "--no-baseline", "--", "bash", "-c", job},
      {.timeout = milliseconds(60'000)});
  const size_t at = r.output.find("SIGKILL to rank ");
  ASSERT_NE(at, std::string::npos) << r.describe() << "\n" << r.output;
  int rank = -1, group = -1;
  long long pid = 0;
  if (replica_groups)
    ASSERT_EQ(std::sscanf(r.output.c_str() + at,
                          "SIGKILL to rank %d of replica group %d (pid %lld)", &rank, &group, &pid),
              3)
        << r.output;
  else
    ASSERT_EQ(std::sscanf(r.output.c_str() + at, "SIGKILL to rank %d (pid %lld)", &rank, &pid), 2)
        << r.output;
  std::ifstream in(dir.path + "/pid." + std::to_string(replica_groups ? group : rank));
  long long worker_pid = 0;
  in >> worker_pid;
  EXPECT_EQ(pid, worker_pid) << "rank " << rank << " group " << group << "\n" << r.output;
}

TEST(Chaos, FindsTheWorkersOfAnotherLaunchersJobByTheirRank) {
  finds_the_workers_of_another_launcher(false);
}
TEST(Chaos, NamesAReplicaGroupsWorkerByItsGroup) { finds_the_workers_of_another_launcher(true); }

#ifdef DTRAIN_HAVE_TRAIN_FASHION_MNIST
const std::string kDtrain = std::string(DTRAIN_BIN_DIR) + "/dtrain";
const std::string kTrainer = std::string(DTRAIN_BIN_DIR) + "/train_fashion_mnist";

bool have_dataset() {
  return fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
}

nlohmann::json chaos_line(const std::string& output) {
  const size_t at = output.rfind("CHAOS {");
  if (at == std::string::npos) return nullptr;
  return nlohmann::json::parse(output.substr(at + 6, output.find('\n', at) - at - 6), nullptr,
                               false);
}

// Runs `dtrain chaos ARGS -- JOB` (its own output dir).
dtrain::testing::CommandResult chaos_of(const dtrain::testing::TempDir& dir,
                                        const std::vector<std::string>& args,
                                        const std::vector<std::string>& job) {
  std::vector<std::string> argv = {kDtrain, "chaos", "--dir", dir.path};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--");
  argv.insert(argv.end(), job.begin(), job.end());
  return dtrain::testing::run_command(argv, {.timeout = milliseconds(240'000)});
}

// Runs `dtrain chaos ARGS -- dtrain run RUN -- train_fashion_mnist TRAIN`.
dtrain::testing::CommandResult chaos(const dtrain::testing::TempDir& dir,
                                     const std::vector<std::string>& args,
                                     const std::vector<std::string>& run,
                                     const std::vector<std::string>& train) {
  std::vector<std::string> job = {kDtrain, "run"};
  job.insert(job.end(), run.begin(), run.end());
  job.insert(job.end(), {"--", kTrainer, "--threads", "1"});
  job.insert(job.end(), train.begin(), train.end());
  return chaos_of(dir, args, job);
}

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  return {(std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()};
}

// train_fashion_mnist's final_loss averages the batch losses of the last 20 steps a process
// trained (its window is not saved with a commit or checkpoint). A deterministic run whose last
// resume left it 20 steps or more ends with the baseline's final_loss to the bit; after a later
// resume the mean is over fewer steps, and only has to show a model that learned. The model
// itself is checked to the bit by eval_loss.
void expect_baseline_final_loss(const nlohmann::json& c, const std::string& faults_dir) {
  constexpr int64_t kLossWindow = 20;
  const std::string out = file_text(faults_dir + "/stdout.log");
  const size_t result_at = out.rfind("RESULT {");
  ASSERT_NE(result_at, std::string::npos) << out;
  const auto result = nlohmann::json::parse(
      out.substr(result_at + 7, out.find('\n', result_at) - result_at - 7), nullptr, false);
  ASSERT_TRUE(result.is_object()) << out;
  int64_t resumed_at = 0;  // the step the last resume started after (0: none)
  if (const size_t at = out.rfind("[rank 0] resumed from "); at != std::string::npos) {
    const size_t step_at = out.find(", step ", at);
    ASSERT_NE(step_at, std::string::npos) << out;
    resumed_at = std::stoll(out.substr(step_at + 7));
  }
  const double final_loss = c["final_loss"].get<double>();
  if (result["steps"].get<int64_t>() - resumed_at >= kLossWindow) {
    EXPECT_EQ(final_loss, c["baseline_loss"].get<double>()) << out;
  } else {
    EXPECT_LT(final_loss, result["initial_loss"].get<double>() * 0.6) << out;
  }
}

// The CHAOS line of a run that ended well after `faults` faults, each recovered, no sample lost
// or repeated; null (the failure recorded) when the run did not end well.
nlohmann::json recovered_every_sample_once(const dtrain::testing::CommandResult& r, int faults) {
  EXPECT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  const nlohmann::json c = chaos_line(r.output);
  EXPECT_TRUE(c.is_object()) << r.output;
  if (!r.ok() || !c.is_object()) return nullptr;
  EXPECT_EQ(c["faults"], faults) << r.output;
  EXPECT_EQ(c["recovered"], faults) << r.output;
  EXPECT_EQ(c["samples_lost"], 0) << r.output;
  EXPECT_EQ(c["samples_repeated"], 0) << r.output;
  return c;
}

TEST(Chaos, TheExampleUnderKillsAndAStopLosesAndRepeatsNoSampleAndEndsAtTheBaselinesLoss) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  dtrain::testing::TempDir dir;
  // A bounded number of faults: on a loaded machine a restart takes longer, and faults every few
  // seconds without end could outpace the training.
  const auto r =
      chaos(dir, {"--schedule", "kill:3s,stop:4s:1s", "--seed", "1", "--max-faults", "4"},
            {"-n", "2", "--max-restarts", "20", "--rdzv-id", "chaos-" + std::to_string(::getpid())},
            {"--deterministic", "--train-samples", "12000", "--epochs", "2"});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  const nlohmann::json c = chaos_line(r.output);
  ASSERT_TRUE(c.is_object()) << r.output;
  EXPECT_GE(c["faults"].get<int>(), 2) << r.output;
  EXPECT_EQ(c["recovered"], c["faults"]) << r.output;
  EXPECT_EQ(c["samples_lost"], 0) << r.output;
  EXPECT_EQ(c["samples_repeated"], 0) << r.output;
  EXPECT_GT(c["goodput"].get<double>(), 0.05) << r.output;
  EXPECT_LT(c["goodput"].get<double>(), 1.5) << r.output;
  // The model is the same bits (commit_resume_test), so its test loss is the baseline's.
  expect_baseline_final_loss(c, dir.path + "/faults");
  ASSERT_TRUE(c["eval_loss"].is_number()) << r.output;
  EXPECT_EQ(c["eval_loss"].get<double>(), c["baseline_eval_loss"].get<double>()) << r.output;
  EXPECT_NE(r.output.find("SIGKILL to rank"), std::string::npos);
  EXPECT_NE(r.output.find("SIGSTOP to rank"), std::string::npos);
  EXPECT_NE(r.output.find("training again"), std::string::npos);
}

TEST(Chaos, LiveRecoveryKeepsTheSurvivorsTrainingWithinASecondAndEverySampleOnce) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  dtrain::testing::TempDir dir;
  // Each rank's batch grows as the world shrinks (--on-resize keep-global-batch): 4 ranks of 100,
  // then 3 of 134, then 2 of 200. Both kills must come while it trains, even when the machine
  // runs fast: a kill after the last step finds the final sum of the test accuracy, which
  // re-forms without a word about batches.
  const auto r = chaos(
      dir, {"--schedule", "kill:3s", "--seed", "2", "--max-faults", "2"}, {"-n", "4", "--live"},
      {"--train-samples", "24000", "--epochs", "2", "--on-resize", "keep-global-batch"});
  // The rest of an epoch dealt over fewer ranks pads none twice: its padding has no weight.
  const nlohmann::json c = recovered_every_sample_once(r, 2);
  ASSERT_TRUE(c.is_object());
  // Nothing restarts: the survivors re-form their group and go on (docs/fault_tolerance.md has
  // the figures; the bound leaves room for a loaded machine).
  for (const auto& s : c["recovery_s"]) EXPECT_LT(s.get<double>(), 2.0) << r.output;
  EXPECT_GT(c["goodput"].get<double>(), 0.5) << r.output;
  EXPECT_NEAR(c["final_loss"].get<double>(), c["baseline_loss"].get<double>(),
              0.15 * c["baseline_loss"].get<double>())
      << r.output;
  std::ifstream in(dir.path + "/faults/stderr.log");
  const std::string faults((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(faults.find("the other workers go on without it (--live)"), std::string::npos)
      << faults;
  EXPECT_NE(faults.find("lost along the way (--live)"), std::string::npos) << faults;
  EXPECT_EQ(faults.find("restart"), std::string::npos) << faults;
  std::ifstream out_in(dir.path + "/faults/stdout.log");
  const std::string out((std::istreambuf_iterator<char>(out_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(out.find("generation 1 of 3 rank(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("batch 134 per rank, learning rate 0.01)"), std::string::npos) << out;
  EXPECT_NE(out.find("batch 200 per rank, learning rate 0.01)"), std::string::npos) << out;
}

// The Horovod-style distributed optimizer the same way: its coordinator's group goes with the
// world, the survivors make it again on the new one. Both kills come while it trains, as above.
TEST(Chaos, LiveRecoveryOfTheDistributedOptimizerKeepsTheSurvivorsTrainingAndEverySampleOnce) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  dtrain::testing::TempDir dir;
  const auto r = chaos(dir, {"--schedule", "kill:3s", "--seed", "2", "--max-faults", "2"},
                       {"-n", "4", "--live"},
                       {"--strategy", "optimizer", "--train-samples", "30000", "--epochs", "2",
                        "--on-resize", "keep-global-batch"});
  const nlohmann::json c = recovered_every_sample_once(r, 2);
  ASSERT_TRUE(c.is_object());
  for (const auto& s : c["recovery_s"]) EXPECT_LT(s.get<double>(), 2.0) << r.output;
  EXPECT_NEAR(c["final_loss"].get<double>(), c["baseline_loss"].get<double>(),
              0.15 * c["baseline_loss"].get<double>())
      << r.output;
  std::ifstream out_in(dir.path + "/faults/stdout.log");
  const std::string out((std::istreambuf_iterator<char>(out_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(out.find("generation 2 of 2 rank(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("\"strategy\":\"optimizer\""), std::string::npos) << out;
}

// Parameter-server workers (synchronous): the survivors re-form, the servers forget the dead
// worker and drop the step it cut short, which the survivors redo; replacements take the dead
// one's worker index and start where the others stand.
TEST(Chaos, LiveRecoveryOfParameterServerWorkersRedoesTheStepAndLosesNoSample) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  dtrain::testing::TempDir dir;
  const auto r =
      chaos(dir, {"--schedule", "kill:5s", "--seed", "2", "--max-faults", "2"},
            {"-n", "3", "--servers", "2", "--live", "--replace", "2"},
            {"--strategy", "ps", "--ps-mode", "sync", "--train-samples", "30000", "--epochs", "2"});
  const nlohmann::json c = recovered_every_sample_once(r, 2);
  ASSERT_TRUE(c.is_object());
  for (const auto& s : c["recovery_s"]) EXPECT_LT(s.get<double>(), 2.0) << r.output;
  const std::string err = file_text(dir.path + "/faults/stderr.log");
  EXPECT_NE(err.find("ps server 1 (127.0.0.1:"), std::string::npos) << err;
  EXPECT_NE(err.find(": the others go on without it"), std::string::npos) << err;
  EXPECT_NE(err.find("started a replacement for rank"), std::string::npos) << err;
  const std::string out = file_text(dir.path + "/faults/stdout.log");
  EXPECT_NE(out.find("\"strategy\":\"ps\""), std::string::npos) << out;
  EXPECT_NE(out.find("going on from step"), std::string::npos) << out;
  // Asynchronous workers would not notice a death: refused, saying why.
  const auto async =
      dtrain::testing::run_command({kDtrain, "run", "-n", "2", "--servers", "1", "--live", "--",
                                    kTrainer, "--strategy", "ps", "--ps-mode", "async"},
                                   {.timeout = milliseconds(60'000)});
  EXPECT_FALSE(async.ok()) << async.output;
  EXPECT_NE(async.output.find("dtrain run --live with --strategy ps needs --ps-mode sync"),
            std::string::npos)
      << async.output;
}

// A parameter-server worker that re-forms late (stopped or cut off meanwhile) is left out, and
// the servers forget its connection with the dead rank's; taken in again, it connects anew and
// takes part to the end (the servers refuse the forgotten connection, naming it).
TEST(Chaos, AParameterServerWorkerLeftOutAndTakenInAgainConnectsToTheServersAnew) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  dtrain::testing::TempDir dir;
  // Seed 2 kills rank 3; rank 2 re-forms 8 s late, after the others' settle time (5 s).
  const auto r = chaos(dir, {"--schedule", "kill:6s", "--seed", "2", "--max-faults", "1",
                             "--no-baseline"},
                       {"-n", "4", "--servers", "1", "--live"},
                       {"--strategy", "ps", "--ps-mode", "sync", "--train-samples", "30000",
                        "--epochs", "2", "--late-rank", "2", "--late-ms", "8000"});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  EXPECT_NE(r.output.find("SIGKILL to rank 3 "), std::string::npos) << r.output;
  const std::string err = file_text(dir.path + "/faults/stderr.log");
  EXPECT_NE(err.find("rank 2 at start was left out of generation 1"), std::string::npos) << err;
  EXPECT_NE(err.find("rank 2 at start, left out of a generation, taken in by generation 2"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("was forgotten when the other workers went on without it"),
            std::string::npos)
      << err;
  const std::string out = file_text(dir.path + "/faults/stdout.log");
  EXPECT_NE(out.find("\"strategy\":\"ps\",\"world_size\":3,"), std::string::npos) << out;
}

// ZeRO stage 3 (train_sharded): a dead rank's shard is held nowhere but in the snapshots, here
// in memory, each rank's shard also with its neighbour (sharded_snapshot.h), so the survivors
// shard the model anew over the new world and restore the snapshot of the last step; a
// replacement joins the same way, its shards sent by the members. Every sample once.
TEST(Chaos, LiveRecoveryOfZeroReshardsTheSnapshotInMemoryAndLosesNoSample) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  dtrain::testing::TempDir dir;
  std::vector<std::string> job = {kDtrain, "run", "-n", "3", "--live", "--replace", "1", "--"};
  job.insert(job.end(), {std::string(DTRAIN_BIN_DIR) + "/train_sharded", "--threads", "1",
                         "--stage", "3", "--epochs", "2"});
  const auto r = chaos_of(dir, {"--schedule", "kill:3s", "--seed", "2", "--max-faults", "2"}, job);
  const nlohmann::json c = recovered_every_sample_once(r, 2);
  ASSERT_TRUE(c.is_object());
  for (const auto& s : c["recovery_s"]) EXPECT_LT(s.get<double>(), 2.0) << r.output;
  const std::string out = file_text(dir.path + "/faults/stdout.log");
  EXPECT_NE(out.find("(lost rank(s) 2 at start), going on from step "), std::string::npos) << out;
  EXPECT_NE(out.find("(taking in rank(s) 2 at start), going on from step "), std::string::npos)
      << out;
  EXPECT_NE(out.find(" of the snapshot in memory"), std::string::npos) << out;
  EXPECT_NE(out.find("\"strategy\":\"zero3\""), std::string::npos) << out;
  // Without snapshots there is nothing to go on from: refused, saying why.
  const auto bare = dtrain::testing::run_command(
      {kDtrain, "run", "-n", "2", "--live", "--", std::string(DTRAIN_BIN_DIR) + "/train_sharded",
       "--snapshot-every", "0"},
      {.timeout = milliseconds(60'000)});
  EXPECT_FALSE(bare.ok()) << bare.output;
  EXPECT_NE(bare.output.find("--snapshot-every 0 without --checkpoint-dir leaves none"),
            std::string::npos)
      << bare.output;
}

// A rank that dies in ZeRO's test (after the last step) takes its shard of the model with it: the
// survivors go back to the newest snapshot, train the steps since it again, and test once more.
TEST(Chaos, ARankThatDiesInZerosTestSendsTheSurvivorsBackToTheSnapshotAndTheyTestAgain) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const auto r = dtrain::testing::run_command(
      {kDtrain, "run", "-n", "3", "--live", "--", std::string(DTRAIN_BIN_DIR) + "/train_sharded",
       "--threads", "1", "--stage", "3", "--epochs", "1", "--train-samples", "6000",
       "--snapshot-every", "7", "--fail-in-test", "1"},
      {.timeout = milliseconds(120'000)});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  // 6,000 samples in batches of 64 per rank: 32 steps, the newest snapshot at step 28.
  EXPECT_NE(r.output.find("generation 1 of 2 rank(s) formed in "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(lost rank(s) 1 at start in the test), going on from step 28 of the "
                          "snapshot in memory"),
            std::string::npos)
      << r.output;
  const size_t at = r.output.rfind("RESULT {");
  ASSERT_NE(at, std::string::npos) << r.output;
  const auto result =
      nlohmann::json::parse(r.output.substr(at + 7, r.output.find('\n', at) - at - 7));
  EXPECT_EQ(result["world_size"], 2) << r.output;
  EXPECT_GT(result["test_accuracy"].get<double>(), 0.6) << r.output;
}

// The same with the training set in TFRecord shards: each survivor's open dataset is dealt the
// rest of the epoch anew, its padding without weight, so that every record is trained once.
TEST(Chaos, LiveRecoveryDealsShardedDataOverTheSurvivorsEveryRecordOnce) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  dtrain::testing::TempDir dir;
  const auto wrote = dtrain::testing::run_command({kDtrain, "data", "write", "--fashion-mnist",
                                                   "/usr/share/datasets/fashion-mnist", "--out",
                                                   dir.path + "/shards/train", "--shards", "8"});
  ASSERT_TRUE(wrote.ok()) << wrote.describe() << "\n" << wrote.output;
  const auto r = chaos(dir, {"--schedule", "kill:4s", "--seed", "2", "--max-faults", "2"},
                       {"-n", "4", "--live"},
                       {"--epochs", "1", "--data-shards", dir.path + "/shards/train-*.tfrecord",
                        "--on-resize", "keep-global-batch"});
  const nlohmann::json c = recovered_every_sample_once(r, 2);
  ASSERT_TRUE(c.is_object());
  std::ifstream out_in(dir.path + "/faults/stdout.log");
  const std::string out((std::istreambuf_iterator<char>(out_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(out.find("generation 2 of 2 rank(s)"), std::string::npos) << out;
}

TEST(Chaos, ReplacementsJoinTheLiveWorkersWithTheirStateAndEverySampleOnce) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  dtrain::testing::TempDir dir;
  // The learning rate follows the world (--on-resize scale-lr): 0.01 with 3 ranks, 2/3 of it
  // with 2. Checkpoints go on through the changes of the world, written by each one's rank 0.
  const std::string checkpoints = dir.path + "/{run}-checkpoints";
  const auto r = chaos(dir, {"--schedule", "kill:4s", "--seed", "3", "--max-faults", "2"},
                       {"-n", "3", "--live", "--replace", "2"},
                       {"--train-samples", "24000", "--epochs", "2", "--on-resize", "scale-lr",
                        "--checkpoint-dir", checkpoints, "--checkpoint-every", "25"});
  const nlohmann::json c = recovered_every_sample_once(r, 2);
  ASSERT_TRUE(c.is_object());
  EXPECT_NEAR(c["final_loss"].get<double>(), c["baseline_loss"].get<double>(),
              0.15 * c["baseline_loss"].get<double>())
      << r.output;
  std::ifstream err_in(dir.path + "/faults/stderr.log");
  const std::string err((std::istreambuf_iterator<char>(err_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(err.find("started a replacement for rank"), std::string::npos) << err;
  // Each replacement is taken in, or comes after training ended: either way it ends well.
  EXPECT_NE(err.find("3 worker(s) ended well; 2 lost along the way (--live)"), std::string::npos)
      << err;
  std::ifstream out_in(dir.path + "/faults/stdout.log");
  const std::string out((std::istreambuf_iterator<char>(out_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(out.find("a replacement: rank "), std::string::npos) << out;
  EXPECT_NE(out.find("going on from step"), std::string::npos) << out;
  EXPECT_NE(out.find("of 2 rank(s) formed"), std::string::npos) << out;
  EXPECT_NE(out.find("batch 100 per rank, learning rate 0.00666667)"), std::string::npos) << out;

  // The newest checkpoint is the last step's, written by the world at the end, and a new start
  // of the job resumes from it (training is over: nothing left to train).
  const std::string faults_dir = dir.path + "/faults-checkpoints";
  const nlohmann::json result = nlohmann::json::parse(out.substr(
      out.rfind("RESULT ") + 7, out.find('\n', out.rfind("RESULT ")) - out.rfind("RESULT ") - 7));
  const int64_t steps = result["steps"].get<int64_t>();
  char name[32];
  std::snprintf(name, sizeof name, "step-%06lld", static_cast<long long>(steps));
  std::ifstream manifest_in(faults_dir + "/" + name + "/manifest.json");
  ASSERT_TRUE(manifest_in.good()) << faults_dir << "/" << name << "\n" << out;
  const nlohmann::json manifest = nlohmann::json::parse(manifest_in);
  EXPECT_EQ(manifest["step"], steps);
  // 3 ranks, or 2 where the second replacement came after training ended.
  EXPECT_GE(manifest["world_size"].get<int>(), 2) << manifest.dump();
  const auto resumed =
      dtrain::testing::run_command({kTrainer, "--threads", "1", "--train-samples", "24000",
                                    "--epochs", "2", "--checkpoint-dir", faults_dir},
                                   {.timeout = milliseconds(120'000)});
  ASSERT_TRUE(resumed.ok()) << resumed.describe() << "\n" << resumed.output;
  EXPECT_NE(resumed.output.find(std::string("resumed from ") + faults_dir + "/" + name),
            std::string::npos)
      << resumed.output;
}

// The example on emulated hosts (scripts/netns-hosts.sh), a node of one worker on each, every node
// `dtrain run --live --replace 1` (a worker that stops is replaced on its host).
std::vector<std::string> on_hosts(const dtrain::testing::NamespaceHosts& hosts,
                                  const std::vector<std::string>& train) {
  std::vector<std::string> job = {hosts.script,
                                  "job",
                                  hosts.name,
                                  kDtrain,
                                  "run",
                                  "-n",
                                  "1",
                                  "--nnodes",
                                  std::to_string(hosts.count),
                                  "--node-rank",
                                  "{node}",
                                  "--master-addr",
                                  "{host0}",
                                  "--master-port",
                                  "29730",
                                  "--live",
                                  "--replace",
                                  "1",
                                  "--",
                                  kTrainer,
                                  "--threads",
                                  "1"};
  job.insert(job.end(), train.begin(), train.end());
  return job;
}

TEST(Chaos, AHostCutOffTheNetworkIsLeftOutAndReplacedOnceBackAndNoSampleIsLost) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  dtrain::testing::NamespaceHosts hosts("cc", 3);
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  dtrain::testing::TempDir dir;
  // Host 2 (seed 2's victim) is cut off for 20 s: ranks 0 and 1 find their connections to it
  // dead after 7 s and, a majority, go on without it. Rank 2 either gives up on the store and
  // stops, and once the network is back its launcher reaches the store again and starts a
  // replacement; or (when its store retries outlast the cut, as on a loaded machine) it reaches
  // the store itself, finds it was left out and asks to be taken in. Either way the others take
  // it in with their state (or it ends at once, when they finished first). Every sample once.
  const auto r = chaos_of(dir, {"--schedule", "cut:21s:20s", "--seed", "2", "--max-faults", "1"},
                          on_hosts(hosts, {"--epochs", "3"}));
  const nlohmann::json c = recovered_every_sample_once(r, 1);
  ASSERT_TRUE(c.is_object());
  EXPECT_NE(r.output.find("21.0 s into training: cut the host of rank 2 (pid "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(hosts.name + "-h2, off the network for 20 s"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("faults run: the host is back on the network"), std::string::npos)
      << r.output;
  EXPECT_LT(c["recovery_s"][0].get<double>(), 20.0) << r.output;  // before the host is back
  const std::string err = file_text(dir.path + "/faults/stderr.log");
  EXPECT_NE(err.find("node 2 reaches the job's store again"), std::string::npos) << err;
  EXPECT_TRUE(err.find("started a replacement for rank 2") != std::string::npos ||
              err.find("rank 2 at start was left out of generation 1") != std::string::npos)
      << err;
  const std::string out = file_text(dir.path + "/faults/stdout.log");
  EXPECT_NE(out.find("generation 1 of 2 rank(s) formed"), std::string::npos) << out;
  // Taken in, or (on a machine where the others finished first) told that training is over.
  EXPECT_TRUE(out.find("taking in rank(s) 2 at start") != std::string::npos ||
              out.find("training ended before the others could take it in") != std::string::npos)
      << out;
}

// ZeRO-3 on three emulated hosts of two ranks each: each rank's copy of its shard is on the next
// host, so when host 2 is cut off for good, its two ranks' shards (which no survivor's model
// holds) are restored from host 0's memory, and hosts 0 and 1 train on as four ranks.
TEST(Chaos, AHostLostWholeTakesNoShardOfZeroWithIt) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  dtrain::testing::NamespaceHosts hosts("cz", 3);
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  std::vector<std::unique_ptr<dtrain::testing::Launched>> launched;
  std::vector<dtrain::testing::Launched*> all;
  for (int node = 0; node < hosts.count; ++node) {
    launched.push_back(std::make_unique<dtrain::testing::Launched>(
        std::vector<std::string>{"run", "-n", "2", "--nnodes", std::to_string(hosts.count),
                                 "--node-rank", std::to_string(node), "--master-addr",
                                 hosts.addr(0), "--master-port", "29740", "--live", "--",
                                 std::string(DTRAIN_BIN_DIR) + "/train_sharded", "--threads",
                                 "1", "--stage", "3", "--epochs", "2"},
        hosts.on(node)));
    all.push_back(launched.back().get());
  }
  auto dump = [&] {
    std::string text;
    for (size_t i = 0; i < all.size(); ++i)
      text += "--- host " + std::to_string(i) + ":\n" + all[i]->out() + all[i]->err() + "\n";
    return text;
  };
  // A few steps in (rank 0 prints a step line every 2 s), host 2 goes off the network.
  ASSERT_TRUE(dtrain::testing::wait_for(
      [&] { return dtrain::testing::contains(all[0]->out(), "] step "); }, all,
      milliseconds(120'000)))
      << dump();
  ASSERT_TRUE(hosts.cut(2));
  EXPECT_EQ(dtrain::testing::exit_code(all[0]->wait(milliseconds(180'000))), 0) << dump();
  EXPECT_EQ(dtrain::testing::exit_code(all[1]->wait(milliseconds(30'000))), 0) << dump();
  EXPECT_NE(dtrain::testing::exit_code(all[2]->wait(milliseconds(120'000))), 0) << dump();
  const std::string out = all[0]->out();
  EXPECT_NE(out.find("(lost rank(s) 4, 5 at start), going on from step "), std::string::npos)
      << dump();
  EXPECT_NE(out.find(" of the snapshot in memory"), std::string::npos) << dump();
  EXPECT_NE(out.find("\"world_size\":4"), std::string::npos) << dump();
  EXPECT_EQ(all[0]->err().find("lacks the shard"), std::string::npos) << dump();
}

TEST(Chaos, ACutRefusesAWorkerOnThisMachinesOwnNetworkAndStopsTheJob) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  dtrain::testing::TempDir dir;
  const auto r = chaos(dir, {"--schedule", "cut:1s:500ms", "--no-baseline"}, {"-n", "2"},
                       {"--train-samples", "60000", "--epochs", "4"});
  EXPECT_FALSE(r.ok()) << r.output;
  EXPECT_LT(r.seconds, 60.0) << r.output;  // stopped, not trained to the end
  EXPECT_NE(r.output.find("runs in this machine's own network namespace (cutting it would cut "
                          "this machine, and the job's store with it)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("scripts/netns-hosts.sh job NAME dtrain run --nnodes N --node-rank "
                          "{node} --master-addr {host0}"),
            std::string::npos)
      << r.output;
}

TEST(Chaos, KillingTheStoresHostStopsEveryNodeAtOnceAndANewStartResumes) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  dtrain::testing::NamespaceHosts hosts("cs", 3);
  if (!hosts.up) GTEST_SKIP() << "cannot create network namespaces here (needs root and iproute2)";
  dtrain::testing::TempDir dir;
  const std::string checkpoints = dir.path + "/checkpoints";
  const auto r = chaos_of(dir, {"--schedule", "store:4s", "--max-faults", "1", "--no-baseline"},
                          on_hosts(hosts, {"--epochs", "2", "--checkpoint-dir", checkpoints,
                                           "--checkpoint-every", "20"}));
  EXPECT_EQ(r.exit_code, 1) << r.describe() << "\n" << r.output;
  const nlohmann::json c = chaos_line(r.output);
  ASSERT_TRUE(c.is_object()) << r.output;
  EXPECT_EQ(c["faults"], 1) << r.output;
  EXPECT_EQ(c["recovered"], 0) << r.output;
  EXPECT_NE(c["exit_code"], 0) << r.output;
  // Host 0's processes die; the others stop within seconds, saying why (the bound leaves room
  // for a loaded machine).
  EXPECT_LT(c["wall_s"].get<double>(), 60.0) << r.output;
  EXPECT_NE(r.output.find("SIGKILL to the store's host: pid "), std::string::npos) << r.output;
  EXPECT_NE(
      r.output.find("listening on port 29730) and every process of its host " + hosts.name + "-h0"),
      std::string::npos)
      << r.output;
  const std::string err = file_text(dir.path + "/faults/stderr.log");
  EXPECT_NE(err.find("the job's store, which node 0's launcher hosts, cannot be reached"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("DONE"), std::string::npos) << err;
  // What was saved is intact: a new start resumes from the newest checkpoint.
  std::string newest;
  for (const auto& e : fs::directory_iterator(checkpoints))
    newest = std::max(newest, e.path().filename().string());
  ASSERT_FALSE(newest.empty()) << r.output;
  const auto resumed = dtrain::testing::run_command(
      {kTrainer, "--threads", "1", "--epochs", "2", "--checkpoint-dir", checkpoints, "--max-steps",
       std::to_string(std::stoi(newest.substr(5)) + 1)},
      {.timeout = milliseconds(120'000)});
  ASSERT_TRUE(resumed.ok()) << resumed.describe() << "\n" << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + checkpoints + "/" + newest), std::string::npos)
      << resumed.output;
}

// A file system of its own (a tmpfs of `mib` MiB at `path`), for a disk that fills; unmounted at
// the end. `error` says why not where this process may not mount one.
struct SmallDisk {
  SmallDisk(std::string at, int mib) : path(std::move(at)) {
    fs::create_directories(path);
    const std::string size = "size=" + std::to_string(mib) + "m";
    if (::mount("tmpfs", path.c_str(), "tmpfs", 0, size.c_str()) == 0)
      mounted = true;
    else
      error = std::strerror(errno);
  }
  ~SmallDisk() {
    if (mounted) ::umount2(path.c_str(), MNT_DETACH);
  }
  std::string path;
  bool mounted = false;
  std::string error;
};

TEST(Chaos, AFullDiskWhileCheckpointingStopsTheJobWithAClearErrorAndLosesNothing) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  dtrain::testing::TempDir dir;
  SmallDisk disk(dir.path + "/disk", 32);
  if (!disk.mounted) GTEST_SKIP() << "cannot mount a tmpfs to fill (needs root): " << disk.error;
  // Checkpoints every 5 steps on the small disk (each run in its own directory), filled for 2 s:
  // the checkpoint that finds it full fails its rank, naming the file and the cause, and the
  // job restarts from its in-memory commit, losing nothing.
  const auto r =
      chaos(dir, {"--schedule", "disk:3s:2s", "--max-faults", "1", "--fill-dir", disk.path},
            {"-n", "2", "--max-restarts", "20", "--rdzv-id", "disk-" + std::to_string(::getpid())},
            {"--deterministic", "--train-samples", "12000", "--epochs", "2", "--checkpoint-dir",
             disk.path + "/{run}", "--checkpoint-every", "5"});
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  const nlohmann::json c = chaos_line(r.output);
  ASSERT_TRUE(c.is_object()) << r.output;
  EXPECT_EQ(c["faults"], 1) << r.output;
  EXPECT_EQ(c["recovered"], 1) << r.output;
  EXPECT_EQ(c["samples_lost"], 0) << r.output;
  EXPECT_EQ(c["samples_repeated"], 0) << r.output;
  expect_baseline_final_loss(c, dir.path + "/faults");
  ASSERT_TRUE(c["eval_loss"].is_number()) << r.output;
  EXPECT_EQ(c["eval_loss"].get<double>(), c["baseline_eval_loss"].get<double>()) << r.output;
  EXPECT_NE(r.output.find("filled the file system of " + disk.path), std::string::npos) << r.output;
  std::ifstream in(dir.path + "/faults/stderr.log");
  const std::string err((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(err.find("writing checkpoint " + disk.path + "/faults/step-"), std::string::npos)
      << err;
  EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(disk.path + "/.dtrain-chaos-fill"));  // the disk given back
  EXPECT_TRUE(fs::exists(disk.path + "/baseline"));             // each run its own checkpoints
}

TEST(Chaos, AJobThatCannotRecoverEndsTheRunWithItsExitCodeAndNoGoodput) {
  if (!have_dataset()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  dtrain::testing::TempDir dir;
  const auto r = chaos(dir, {"--schedule", "kill:2s", "--no-baseline"}, {"-n", "2"},
                       {"--train-samples", "12000", "--epochs", "3"});
  EXPECT_EQ(r.exit_code, 1) << r.describe() << "\n" << r.output;
  const nlohmann::json c = chaos_line(r.output);
  ASSERT_TRUE(c.is_object()) << r.output;
  EXPECT_EQ(c["faults"], 1) << r.output;
  EXPECT_EQ(c["recovered"], 0) << r.output;
  EXPECT_TRUE(c["goodput"].is_null()) << r.output;
  EXPECT_NE(c["exit_code"], 0) << r.output;
}
#endif

}  // namespace
}  // namespace dtrain::launch
