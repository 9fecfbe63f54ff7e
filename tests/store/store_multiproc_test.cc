// Stores used by many processes at once, as ranks use them: forked children, real sockets and a
// real shared file, each run under a deadline.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "store/store_test_util.h"

namespace dtrain::testing {
namespace {

using namespace std::chrono_literals;

// 64 clients in 64 processes: each joins a counter, publishes its key, reads everyone's.
TEST(StoreMultiProcess, SixtyFourClientsExchangeKeys) {
  constexpr int kRanks = 64;
  ServerProcess server;
  const uint16_t port = server.port();
  auto results = run_ranks(
      kRanks,
      [&](int rank) {
        TcpStore store(client_options(port, rank));
        store.add("joined", 1);
        store.set(fmt::format("addr/{}", rank), fmt::format("value-of-{}", rank));
        std::vector<std::string> keys;
        for (int r = 0; r < kRanks; ++r) keys.push_back(fmt::format("addr/{}", r));
        auto values = store.multi_get(keys);
        for (int r = 0; r < kRanks; ++r)
          if (to_text(values[r]) != fmt::format("value-of-{}", r))
            throw std::runtime_error(
                fmt::format("rank {} read '{}' for addr/{}", rank, to_text(values[r]), r));
        // And one by one, from a neighbour's point of view.
        int next = (rank + 1) % kRanks;
        if (store.get_string(fmt::format("addr/{}", next)) != fmt::format("value-of-{}", next))
          throw std::runtime_error("get of the neighbour's key returned the wrong value");
        store.add("done", 1);
      },
      60s);
  ASSERT_TRUE(all_ok(results)) << describe(results);
  TcpStore check(client_options(port));
  EXPECT_EQ(check.get_string("joined"), "64");
  EXPECT_EQ(check.add("done", 0), kRanks);
  EXPECT_EQ(check.num_keys(), kRanks + 2);
}

TEST(StoreMultiProcess, TcpAddFromManyProcessesSums) {
  constexpr int kRanks = 16, kAdds = 100;
  ServerProcess server;
  const uint16_t port = server.port();
  auto results = run_ranks(
      kRanks,
      [&](int rank) {
        TcpStore store(client_options(port, rank));
        for (int i = 0; i < kAdds; ++i) store.add("sum", rank + 1);
      },
      60s);
  ASSERT_TRUE(all_ok(results)) << describe(results);
  TcpStore check(client_options(port));
  EXPECT_EQ(check.add("sum", 0), int64_t{kAdds} * kRanks * (kRanks + 1) / 2);
}

TEST(StoreMultiProcess, FileAddFromManyProcessesSums) {
  constexpr int kRanks = 16, kAdds = 50;
  TempDir dir;
  const std::string path = dir.file("store");
  auto results = run_ranks(
      kRanks,
      [&](int rank) {
        FileStore store(path, 20s);
        for (int i = 0; i < kAdds; ++i) store.add("sum", rank + 1);
        store.set(fmt::format("rank/{}", rank), std::to_string(rank));
      },
      60s);
  ASSERT_TRUE(all_ok(results)) << describe(results);
  FileStore check(path, 5s);
  EXPECT_EQ(check.add("sum", 0), int64_t{kAdds} * kRanks * (kRanks + 1) / 2);
  EXPECT_EQ(check.num_keys(), kRanks + 1);
  EXPECT_EQ(check.get_string("rank/11"), "11");
}

// Rank 0 waits for what rank 1 writes later, through the file only.
TEST(StoreMultiProcess, FileStoreWaitAcrossProcesses) {
  TempDir dir;
  const std::string path = dir.file("store");
  auto results = run_ranks(
      2,
      [&](int rank) {
        FileStore store(path, 20s);
        if (rank == 1) {
          store.wait({"ping"});
          store.set("pong", std::string_view("from 1"));
        } else {
          store.set("ping", std::string_view("from 0"));
          if (store.get_string("pong") != "from 1") throw std::runtime_error("wrong pong");
        }
      },
      30s);
  EXPECT_TRUE(all_ok(results)) << describe(results);
}

// Rank 0 hosts the store in-process (is_server), the others connect to it, as torchrun does.
TEST(StoreMultiProcess, RankZeroHostsTheStore) {
  constexpr int kRanks = 8;
  const uint16_t port = static_cast<uint16_t>(free_port());
  auto results = run_ranks(
      kRanks,
      [&](int rank) {
        TcpStoreOptions options = client_options(port, rank);
        options.is_server = rank == 0;
        TcpStore store(options);
        store.set(fmt::format("r{}", rank), std::to_string(rank * 10));
        for (int r = 0; r < kRanks; ++r)
          if (store.get_string(fmt::format("r{}", r)) != std::to_string(r * 10))
            throw std::runtime_error("wrong value");
        // Rank 0 must outlive the others' last call: it leaves when all said they are done.
        store.add("finished", 1);
        if (rank == 0) {
          for (auto deadline = Clock::now() + 20s; store.add("finished", 0) < kRanks;) {
            if (Clock::now() > deadline) throw std::runtime_error("ranks never finished");
            std::this_thread::sleep_for(5ms);
          }
        }
      },
      60s);
  EXPECT_TRUE(all_ok(results)) << describe(results);
}

// A rank that hosts the store and finishes first waits for the others to hang up (up to a few
// seconds) instead of pulling the store from under their last calls.
TEST(StoreMultiProcess, HostThatFinishesFirstWaitsForTheOthers) {
  const uint16_t port = static_cast<uint16_t>(free_port());
  auto results = run_ranks(
      3,
      [&](int rank) {
        TcpStoreOptions options = client_options(port, rank);
        options.is_server = rank == 0;
        TcpStore store(options);
        store.add("arrived", 1);
        if (rank == 0) {
          // Leaves as soon as everyone is connected (a job's rank 0 cannot finish before the
          // others have joined; under load they may connect only after it added its count).
          while (store.add("arrived", 0) < 3) std::this_thread::sleep_for(1ms);
          return;
        }
        std::this_thread::sleep_for(300ms);
        store.set(fmt::format("late{}", rank), "1");
        if (store.add("arrived", 0) != 3) throw std::runtime_error("lost a count");
      },
      30s);
  EXPECT_TRUE(all_ok(results)) << describe(results);
}

// A client killed while it waits on the server does not disturb anyone else.
TEST(StoreMultiProcess, KilledClientDoesNotHurtTheServer) {
  ServerProcess server;
  const uint16_t port = server.port();
  TcpStore store(client_options(port));
  ::fflush(nullptr);
  pid_t child = ::fork();
  if (child == 0) {
    try {
      TcpStore doomed(client_options(port, 1));
      doomed.set("child/ready", std::string_view("1"));
      doomed.wait({"never/set"}, 60s);
    } catch (...) {
    }
    ::_exit(0);
  }
  ASSERT_GT(child, 0);
  store.wait({"child/ready"}, 10s);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
  // Others are served as before, and a new client can join.
  store.set("after", std::string_view("fine"));
  TcpStore late(client_options(port, 2));
  EXPECT_EQ(late.get_string("after"), "fine");
  EXPECT_EQ(late.num_keys(), 2);
}

}  // namespace
}  // namespace dtrain::testing
