// init_process_group from the environment, as `dtrain run`, torchrun and mpirun leave it.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "common/socket.h"
#include "dtrain/dtrain.h"
#include "dtrain/store.h"
#include "support/addresses.h"
#include "support/group.h"
#include "support/multiproc.h"
#include "support/peer_closed.h"

namespace dtrain::testing {
namespace {

using namespace std::chrono_literals;

// The variables torchrun (and `dtrain run`) set, for rank `rank` of `world` on this machine with
// rank 0 hosting the store on `port`.
void set_torchrun_env(int rank, int world, int port) {
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::unsetenv("DTRAIN_AGENT_STORE");
}

TEST(Init, FromTorchrunEnvironment) {
  const int port = free_port();
  auto results = run_ranks(3, [&](int rank) {
    set_torchrun_env(rank, 3, port);
    auto pg = init_process_group();
    RANK_CHECK(pg->rank() == rank && pg->size() == 3, "identity {} of {}", pg->rank(), pg->size());
    std::vector<int32_t> v(1, rank * 10);
    if (rank == 0) {
      for (int r = 1; r < 3; ++r) {
        pg->recv(TensorView::of(v), r);
        RANK_CHECK(v[0] == r * 10, "from rank {} got {}", r, v[0]);
      }
    } else {
      pg->send(TensorView::of(v), 0);
    }
  });
  for (auto& r : results) EXPECT_TRUE(r.ok());
}

TEST(Init, FileStoreUrl) {
  const std::string path = ::testing::TempDir() + "/dtrain_init_file_store_" + std::to_string(::getpid());
  std::remove(path.c_str());
  auto results = run_ranks(2, [&](int rank) {
    InitOptions o;
    o.identity.rank = rank;
    o.identity.world_size = 2;
    o.identity.init_method = "file://" + path;
    o.group.advertise_addr = "127.0.0.1";
    auto pg = init_process_group(o);
    std::vector<float> v(2, 1.0f + rank);
    if (rank == 1) pg->send(TensorView::of(v), 0);
    else {
      pg->recv(TensorView::of(v), 1);
      RANK_CHECK(v[1] == 2.0f, "got {}", v[1]);
    }
  });
  for (auto& r : results) EXPECT_TRUE(r.ok());
  std::remove(path.c_str());
}

TEST(Init, WorldOfOneNeedsNothing) {
  auto results = run_ranks(1, [&](int) {
    for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
                          "SLURM_NTASKS", "JOB_COMPLETION_INDEX", "TF_CONFIG"})
      ::unsetenv(v);
    auto pg = init_process_group();
    RANK_CHECK(pg->size() == 1 && pg->rank() == 0, "{} of {}", pg->rank(), pg->size());
  });
  EXPECT_TRUE(results[0].ok());
}

// What stderr said, for checks on the log (each rank child writes its own file).
std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Workers started by hand against a standalone store (`dtrain store`) without
// DTRAIN_AGENT_STORE: rank 0 cannot host the store and says what to set; rank 1, waiting for rank
// 0, says so every report interval instead of waiting in silence, then times out.
TEST(Init, HandStartedWorkersBesideAStoreAreToldWhatToSet) {
#ifdef __SANITIZE_THREAD__
  // The ranks fork from a process that runs the store server's threads, and start threads of
  // their own: ThreadSanitizer cannot follow that ("dup thread with used id").
  GTEST_SKIP() << "not under ThreadSanitizer: threads after a multi-threaded fork";
#endif
  TcpStoreServer store({.port = 0});  // what `dtrain store` runs
  const std::string log = ::testing::TempDir() + "/dtrain_init_hand_" + std::to_string(::getpid());
  auto results = run_ranks(2, [&](int rank) {
    set_torchrun_env(rank, 2, store.port());
    ::setenv("DTRAIN_STRAGGLER_SECONDS", "1", 1);
    ::setenv("DTRAIN_CONNECT_TIMEOUT", "3", 1);
    RANK_CHECK(std::freopen((log + std::to_string(rank)).c_str(), "w", stderr) != nullptr,
               "cannot redirect stderr");
    try {
      init_process_group();
    } catch (const Error& e) {
      std::fprintf(stderr, "threw: %s\n", e.what());
      std::fflush(stderr);
      ::_exit(3);
    }
  }, 60s);
  for (auto& r : results) EXPECT_EQ(r.exit_code, 3);
  const std::string rank0 = slurp(log + "0"), rank1 = slurp(log + "1");
  EXPECT_NE(rank0.find("rank 0: cannot host the job's store"), std::string::npos) << rank0;
  EXPECT_NE(rank0.find("Address already in use"), std::string::npos) << rank0;
  EXPECT_NE(rank0.find("set DTRAIN_AGENT_STORE=1 on every rank"), std::string::npos) << rank0;
  EXPECT_NE(rank1.find("rank 1: group world rendezvous has waited 1."), std::string::npos) << rank1;
  EXPECT_NE(rank1.find("rank 0 has not registered yet"), std::string::npos) << rank1;
  EXPECT_NE(rank1.find("threw: "), std::string::npos) << rank1;
  std::remove((log + "0").c_str());
  std::remove((log + "1").c_str());
}

// A rank that never comes: rank 0 reports every interval who has not registered, against the
// limit, and the others stay quiet at the default level.
TEST(Init, RankZeroReportsWhoTheRendezvousWaitsFor) {
  const int port = free_port();
  const std::string log = ::testing::TempDir() + "/dtrain_init_wait_" + std::to_string(::getpid());
  auto results = run_ranks(2, [&](int rank) {  // of a world of 3: rank 2 never starts
    set_torchrun_env(rank, 3, port);
    ::setenv("DTRAIN_STRAGGLER_SECONDS", "1", 1);
    ::setenv("DTRAIN_CONNECT_TIMEOUT", "3.5", 1);
    RANK_CHECK(std::freopen((log + std::to_string(rank)).c_str(), "w", stderr) != nullptr,
               "cannot redirect stderr");
    try {
      init_process_group();
    } catch (const TimeoutError& e) {
      std::fflush(stderr);
      ::_exit(3);
    }
  }, 60s);
  for (auto& r : results) EXPECT_EQ(r.exit_code, 3);
  const std::string rank0 = slurp(log + "0"), rank1 = slurp(log + "1");
  EXPECT_NE(rank0.find("rank 0: group world rendezvous has waited 1."), std::string::npos) << rank0;
  EXPECT_NE(rank0.find("of a 3.5 s limit: 2 of 3 ranks have registered"), std::string::npos)
      << rank0;
  EXPECT_NE(rank0.find("not registered: rank 2 "), std::string::npos) << rank0;
  EXPECT_GE(std::count(rank0.begin(), rank0.end(), '\n'), 3) << rank0;  // 1 s, 2 s, 3 s
  EXPECT_EQ(rank1.find("rendezvous has waited"), std::string::npos) << rank1;
  std::remove((log + "0").c_str());
  std::remove((log + "1").c_str());
}

// Rank 0's rank port as it advertises it in the job's store (host:port), read as rank `rank`.
std::string rank0_address(int store_port, int rank) {
  TcpStoreOptions so;
  so.host = "127.0.0.1";
  so.port = static_cast<uint16_t>(store_port);
  so.rank = rank;
  so.connect_timeout = std::chrono::seconds(20);
  TcpStore store(so);
  store.wait({"world/addr/0"}, std::chrono::seconds(20));
  return store.get_string("world/addr/0");
}

// A job on one machine, its store on 127.0.0.1: the ranks' own ports listen on loopback only,
// so that other machines cannot reach them (they listened on every interface).
TEST(Init, RankPortsOfALoopbackJobListenOnLoopbackOnly) {
  const std::string outside = non_loopback_ipv4();
  if (outside.empty()) GTEST_SKIP() << "this machine has no address but loopback";
  const int port = free_port();
  auto results = run_ranks(2, [&](int rank) {
    set_torchrun_env(rank, 2, port);
    ::unsetenv("DTRAIN_SOCKET_ADDR");
    if (rank == 1) {
      // Before joining: rank 0's rank port, as it advertises it, tried through the other address.
      const std::string addr = rank0_address(port, 1);
      RANK_CHECK(addr.starts_with("127.0.0.1:"), "rank 0 advertises {}", addr);
      const auto rank_port = static_cast<uint16_t>(std::stoi(addr.substr(addr.find(':') + 1)));
      bool reached = true;
      try {
        net::connect_tcp({outside, rank_port}, Deadline::after(300ms), "probe");
      } catch (const Error&) {
        reached = false;
      }
      RANK_CHECK(!reached, "rank 0's port {} answered on {}", rank_port, outside);
    }
    auto pg = init_process_group();
    pg->barrier()->wait();
  }, 60s);
  for (auto& r : results) EXPECT_TRUE(r.ok());
}

// Silent sockets at a rank's port during rendezvous (a port scanner, a stuck client) delay and
// fail no real peer: handshakes run side by side, each bounded, and when too many come from
// one host, the oldest *silent* one is closed. (They were taken one at a time, 10 s each: six
// of them failed a job. Then the oldest was closed whatever it had sent: a real rank that
// connected amid the flood, its hello sent but not yet read, was closed and failed the job.)
TEST(Init, SilentConnectionsDoNotHoldUpTheRendezvous) {
  const int port = free_port();
  auto results = run_ranks(3, [&](int rank) {
    set_torchrun_env(rank, 3, port);
    ::setenv("DTRAIN_CONNECT_TIMEOUT", "8", 1);
    std::vector<net::Fd> silent;
    net::Fd speaking;  // a client in mid-hello: it has spoken, so it is not closed to make room
    if (rank == 2) {  // opens it and 40 silent connections to rank 0's port, then joins 1 s late
      const std::string addr = rank0_address(port, 2);
      const net::HostPort rank0{"127.0.0.1",
                                static_cast<uint16_t>(std::stoi(addr.substr(addr.find(':') + 1)))};
      speaking = net::connect_tcp(rank0, Deadline::after(5s), "speaking");
      const char part_of_a_hello[] = {'D', 'T'};
      RANK_CHECK(::send(speaking.get(), part_of_a_hello, 2, 0) == 2, "send: {}", errno);
      std::this_thread::sleep_for(100ms);  // its handshake thread has seen the bytes
      for (int i = 0; i < 40; ++i)
        silent.push_back(net::connect_tcp(rank0, Deadline::after(5s), "silent"));
      std::this_thread::sleep_for(1s);
      RANK_CHECK(closed_by_peer(silent.front().get(), 2s), "the oldest silent one is open");
      RANK_CHECK(!closed_by_peer(speaking.get(), 0ms),
                 "the speaking connection was closed to make room for silent ones");
    }
    const auto start = std::chrono::steady_clock::now();
    auto pg = init_process_group();
    pg->barrier()->wait();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    RANK_CHECK(took < 6.0, "the rendezvous took {:.1f} s", took);
  }, 60s);
  for (auto& r : results) EXPECT_TRUE(r.ok());
}

}  // namespace
}  // namespace dtrain::testing
