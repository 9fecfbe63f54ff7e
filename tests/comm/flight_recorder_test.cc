// The flight recorder on its own, in one process: threads record into rings of their own and a
// dump merges them oldest first; a small call ends at its thread's last clock reading, a large
// one reads the clock; a call ended by another thread is counted, and the beat page
// `dtrain run` reads sums every thread's counter; a ring keeps its last entries and ignores the
// ends of calls it has overwritten; the calls of a thread that ended stay under its id when a
// new thread takes its ring over; a Python site names the calls made inside it; a native group's
// collectives are recorded in its history, a muted group's are not (while its history still says
// what it called), and a group that is gone keeps its calls in the dumps. (The recorder is the
// process's: each test uses a group of its own and reads only that group's calls.)
#include "comm/flight_recorder.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/thread_clock.h"
#include "launch/hang_monitor.h"
#include "support/temp_dir.h"

namespace dtrain::comm {
namespace {

using json = nlohmann::json;

FlightRecorder& recorder() { return FlightRecorder::global(); }

FlightCall collective(uint16_t group, uint32_t seq) {
  FlightCall call{.kind = FlightCall::Kind::kCollective, .group = group, .seq = seq};
  call.call.kind = CollectiveKind::kAllreduce;
  call.call.dtype = DType::kF32;
  call.call.count = 4;
  return call;
}

// The dumped calls of group `group`, oldest first.
std::vector<json> calls_of(const std::string& group) {
  const std::string path = recorder().dump("test");
  EXPECT_FALSE(path.empty());
  std::ifstream in(path);
  const json dump = json::parse(in);
  std::vector<json> calls;
  for (const auto& c : dump.at("calls"))
    if (c.at("group") == group) calls.push_back(c);
  return calls;
}

class FlightRecorderTest : public ::testing::Test {
 protected:
  void SetUp() override { ::setenv("DTRAIN_FLIGHT_DIR", dir_.path.c_str(), 1); }
  dtrain::testing::TempDir dir_;
};

TEST_F(FlightRecorderTest, ThreadsRecordIntoRingsOfTheirOwnAndADumpMergesThemOldestFirst) {
  const uint16_t group = recorder().group_id("threads");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (uint32_t i = 1; i <= 100; ++i)
        recorder().ended(recorder().record(collective(group, t * 1000 + i)), true);
    });
  for (auto& t : threads) t.join();
  const auto calls = calls_of("threads");
  ASSERT_EQ(calls.size(), 400u);
  std::set<int> tids;
  std::set<uint32_t> seqs;
  double previous = 0;
  for (const auto& c : calls) {
    EXPECT_EQ(c.at("state"), "completed");
    EXPECT_EQ(c.at("call"), "all_reduce(f32, 4, sum)");
    EXPECT_GE(c.at("enqueued").get<double>(), previous);
    previous = c.at("enqueued").get<double>();
    tids.insert(c.at("thread").get<int>());
    seqs.insert(c.at("seq").get<uint32_t>());
  }
  EXPECT_EQ(tids.size(), 4u);
  EXPECT_EQ(seqs.size(), 400u);
}

TEST_F(FlightRecorderTest, ACallEndedByAnotherThreadIsCountedAndTheBeatSumsEveryThread) {
  recorder().set_rank(0, 1);  // the page DIR/rank0.beat, as under `dtrain run`
  const auto beat = [&] {
    const auto beats = launch::read_beats(dir_.path);
    EXPECT_EQ(beats.size(), 1u);
    return beats.empty() ? launch::BeatReading{} : beats[0];
  };
  const uint16_t group = recorder().group_id("handed over");
  const auto before = beat();
  uint64_t ticket = 0;
  std::thread([&] { ticket = recorder().record(collective(group, 1)); }).join();
  ASSERT_NE(ticket, 0u);
  EXPECT_EQ(beat().in_calls, before.in_calls + 1);
  EXPECT_EQ(calls_of("handed over").at(0).at("state"), "queued");
  std::thread([&] {
    recorder().started(ticket);
    recorder().ended(ticket, false);
  }).join();
  const auto after = beat();
  EXPECT_EQ(after.in_calls, before.in_calls);
  EXPECT_EQ(after.completed, before.completed + 1);
  const auto calls = calls_of("handed over");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].at("state"), "failed");
  EXPECT_FALSE(calls[0].at("ended").is_null());
}

TEST_F(FlightRecorderTest, ASmallCallEndsAtItsThreadsLastClockReadingAndALargeOneReadsTheClock) {
  const uint16_t group = recorder().group_id("end times");
  const auto lasted = [](const json& c) {
    return c.at("ended").get<double>() - c.at("enqueued").get<double>();
  };
  const auto wait = std::chrono::milliseconds(60);
  // A small call whose wait read the clock after 60 ms (as a wait does after a sleep).
  uint64_t ticket = recorder().record(collective(group, 1));
  std::this_thread::sleep_for(wait);
  thread_clock::now();
  recorder().ended(ticket, true);
  // A small call that never waited: it ended as it began, to within its own arithmetic.
  recorder().ended(recorder().record(collective(group, 2)), true);
  // A large call reads the clock itself.
  FlightCall large = collective(group, 3);
  large.call.count = 1 << 20;
  ticket = recorder().record(large);
  std::this_thread::sleep_for(wait);
  recorder().ended(ticket, true);
  const auto calls = calls_of("end times");
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_GE(lasted(calls[0]), 0.059);
  EXPECT_LT(lasted(calls[0]), 5.0);
  EXPECT_LT(lasted(calls[1]), 0.001);
  EXPECT_GE(lasted(calls[2]), 0.059);
  EXPECT_LT(lasted(calls[2]), 5.0);
}

TEST_F(FlightRecorderTest, ARingKeepsItsLastEntriesAndIgnoresTheEndsOfOverwrittenCalls) {
  const uint16_t group = recorder().group_id("overwritten");
  std::thread([&] {
    std::vector<uint64_t> tickets;
    for (uint32_t i = 1; i <= 3000; ++i) tickets.push_back(recorder().record(collective(group, i)));
    // The first calls' slots hold later calls now: ending them must leave those alone.
    for (size_t i = 0; i < 100; ++i) recorder().ended(tickets[i], false);
    for (size_t i = 2000; i < tickets.size(); ++i) recorder().ended(tickets[i], true);
  }).join();
  const auto calls = calls_of("overwritten");
  ASSERT_EQ(calls.size(), 2048u);  // DTRAIN_FLIGHT_RECORDER's 2,000, rounded up
  EXPECT_EQ(calls.front().at("seq"), 3000u - 2048 + 1);
  EXPECT_EQ(calls.back().at("seq"), 3000u);
  for (const auto& c : calls)
    EXPECT_EQ(c.at("state"), c.at("seq").get<uint32_t>() > 2000 ? "completed" : "queued") << c;
}

TEST_F(FlightRecorderTest, TheCallsOfAThreadThatEndedStayUnderItsIdWhenTheNextTakesItsRing) {
  const uint16_t group = recorder().group_id("succession");
  std::vector<int> tids;
  for (uint32_t t = 0; t < 2; ++t)
    std::thread([&, t] {
      tids.push_back(static_cast<int>(::gettid()));
      for (uint32_t i = 1; i <= 5; ++i)
        recorder().ended(recorder().record(collective(group, t * 5 + i)), true);
    }).join();
  auto calls = calls_of("succession");
  ASSERT_EQ(calls.size(), 10u);
  // Calls within one tick of the coarse clock keep no order across rings: by number.
  std::sort(calls.begin(), calls.end(),
            [](const json& a, const json& b) { return a.at("seq") < b.at("seq"); });
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].at("seq"), i + 1);
    EXPECT_EQ(calls[i].at("thread"), tids[i / 5]) << calls[i];
  }
}

TEST_F(FlightRecorderTest, APythonSiteNamesTheCallsMadeInsideIt) {
  const uint16_t group = recorder().group_id("python");
  const uint32_t site = recorder().python_site("train.py:42 in step <- train.py:88 in main");
  EXPECT_EQ(recorder().python_site("train.py:42 in step <- train.py:88 in main"), site);
  {
    const FlightRecorder::PythonSite inside(site);
    recorder().ended(recorder().record(collective(group, 1)), true);
  }
  recorder().ended(recorder().record(collective(group, 2)), true);
  const auto calls = calls_of("python");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].at("python"), "train.py:42 in step <- train.py:88 in main");
  EXPECT_FALSE(calls[1].contains("python"));
}

TEST_F(FlightRecorderTest, AGroupsCollectivesAreRecordedInItsHistoryUnlessTheGroupIsMuted) {
  recorder().set_rank(0, 1);
  const auto in_calls = [&] { return launch::read_beats(dir_.path).at(0).in_calls; };
  const uint16_t group = recorder().group_id("history");
  std::shared_ptr<CallHistory> history = recorder().history(group);
  CollectiveCall call{.kind = CollectiveKind::kBroadcast, .dtype = DType::kI64, .count = 8};
  const auto before = in_calls();
  const auto enqueued = std::chrono::steady_clock::now();
  recorder().called(*history, group, 1, call, "tree", &call, enqueued);
  EXPECT_EQ(in_calls(), before + 1);
  // Run queued, by another thread, and completed.
  std::thread([&] {
    recorder().started(*history, 1);
    recorder().finished(*history, 1, true);
  }).join();
  EXPECT_EQ(in_calls(), before);
  recorder().called(*history, group, 2, call, "tree", &call, enqueued);
  recorder().finished(*history, 2, false);
  // The post-mortem's view: a failed call is not finished.
  EXPECT_EQ(history->describe(2), "called broadcast(i64, 8, root 0)");
  EXPECT_EQ(history->first_unfinished(), 2u);
  recorder().mute(group);
  recorder().called(*history, group, 3, call, "tree", &call, enqueued);
  recorder().finished(*history, 3, true);
  recorder().mute(group, false);
  EXPECT_EQ(in_calls(), before);
  // It knows the muted call, which the recorder left out.
  EXPECT_EQ(history->describe(3), "called broadcast(i64, 8, root 0) and completed it");
  EXPECT_EQ(history->first_unfinished(), 4u);

  auto calls = calls_of("history");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].at("seq"), 1u);
  EXPECT_EQ(calls[0].at("state"), "completed");
  EXPECT_EQ(calls[0].at("call"), "broadcast(i64, 8, root 0)");
  EXPECT_EQ(calls[0].at("algorithm"), "tree");
  EXPECT_EQ(calls[0].at("thread"), static_cast<int>(::gettid()));
  EXPECT_FALSE(calls[0].at("started").is_null());
  EXPECT_FALSE(calls[0].at("ended").is_null());
  EXPECT_TRUE(calls[0].contains("caller"));
  EXPECT_EQ(calls[1].at("seq"), 2u);
  EXPECT_EQ(calls[1].at("state"), "failed");

  // Gone with its group, the history stays in the dumps while it is among the latest 8 gone.
  history.reset();
  EXPECT_EQ(calls_of("history").size(), 2u);
  for (int i = 0; i < 8; ++i) {
    const uint16_t later = recorder().group_id("later " + std::to_string(i));
    recorder().called(*recorder().history(later), later, 1, call, "tree", nullptr, enqueued);
  }
  EXPECT_EQ(calls_of("history").size(), 2u);
  EXPECT_EQ(calls_of("later 0").size(), 1u);
  recorder().history(recorder().group_id("one more"));
  EXPECT_EQ(calls_of("history").size(), 0u);
  EXPECT_EQ(calls_of("later 0").size(), 1u);
}

}  // namespace
}  // namespace dtrain::comm
