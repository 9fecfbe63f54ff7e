// Point-to-point over the TCP transport, between real processes on loopback.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "common/reduce.h"
#include "dtrain/error.h"
#include "dtrain/store.h"
#include "transport/device.h"
#include "transport/tag.h"
#include "transport/pair.h"
#include "transport/wait.h"
#include "support/expect.h"
#include "support/group.h"
#include "support/multiproc.h"

namespace dtrain::testing {
namespace {

using namespace std::chrono_literals;

// Ranks on one host would talk over shared memory by default: these tests are about TCP.
std::shared_ptr<ProcessGroup> tcp_group(int rank, int size, int port, ProcessGroupOptions o = {},
                                        std::chrono::milliseconds timeout = 30s) {
  o.transport = "tcp";
  return make_group(rank, size, port, o, timeout);
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 13)) & 0xff);
  return v;
}

// Two ranks' store and transport device on this host, for tests of the pair itself (below the
// process group).
struct TwoRanks {
  TwoRanks(int rank, int port, const char* transport)
      : rank(rank), store(store_options(rank, port)), device(store, device_options(rank, transport)) {}
  transport::Pair& pair() { return *device.pair(1 - rank); }

  static TcpStoreOptions store_options(int rank, int port) {
    TcpStoreOptions so;
    so.host = "127.0.0.1";
    so.port = static_cast<uint16_t>(port);
    so.is_server = rank == 0;
    so.rank = rank;
    return so;
  }
  static transport::DeviceOptions device_options(int rank, const char* transport) {
    transport::DeviceOptions d;
    d.rank = rank;
    d.size = 2;
    d.advertise_addr = "127.0.0.1";
    d.transport = transport;
    return d;
  }

  int rank;
  TcpStore store;
  transport::Device device;
};

TEST(TcpPair, SendRecvEverySize) {
  const int port = free_port();
  const std::vector<size_t> sizes = {0, 1, 7, 4096, 65537, size_t{1} << 20, size_t{256} << 20};
  expect_all_ok(run_ranks(2, [&](int rank) {
    auto pg = tcp_group(rank, 2, port);
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto expected = pattern(sizes[i], static_cast<uint32_t>(i));
      if (rank == 0) {
        pg->send(TensorView::of(expected), 1, 3);
      } else {
        std::vector<uint8_t> got(sizes[i], 0xee);
        pg->recv(TensorView::of(got), 0, 3);
        RANK_CHECK(got == expected, "payload of {} bytes differs", sizes[i]);
      }
    }
  }, 90s));
}

TEST(TcpPair, TypedTensorsKeepValues) {
  const int port = free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    auto pg = tcp_group(rank, 2, port);
    std::vector<double> d(1000);
    std::vector<int64_t> l(333);
    if (rank == 0) {
      for (size_t i = 0; i < d.size(); ++i) d[i] = 0.5 * static_cast<double>(i) - 3.25;
      for (size_t i = 0; i < l.size(); ++i) l[i] = -static_cast<int64_t>(i) * 1'000'000'007;
      pg->send(TensorView::of(d), 1);
      pg->send(TensorView::of(l), 1);
    } else {
      pg->recv(TensorView::of(d), 0);
      pg->recv(TensorView::of(l), 0);
      for (size_t i = 0; i < d.size(); ++i)
        RANK_CHECK(d[i] == 0.5 * static_cast<double>(i) - 3.25, "d[{}] = {}", i, d[i]);
      for (size_t i = 0; i < l.size(); ++i)
        RANK_CHECK(l[i] == -static_cast<int64_t>(i) * 1'000'000'007, "l[{}] = {}", i, l[i]);
    }
  }));
}

// Many tags interleaved on one connection; receives posted in a different order than the
// sends, some before the data arrives and some after.
TEST(TcpPair, ManyTagsOutOfOrder) {
  const int port = free_port();
  constexpr int kTags = 10, kPerTag = 20;
  expect_all_ok(run_ranks(2, [&](int rank) {
    auto pg = tcp_group(rank, 2, port);
    if (rank == 0) {
      std::vector<std::vector<uint8_t>> bufs;
      std::vector<std::shared_ptr<Work>> works;
      bufs.reserve(kTags * kPerTag);
      for (int k = 0; k < kPerTag; ++k)
        for (int t = 0; t < kTags; ++t) {
          bufs.push_back(pattern(100 + t * 1000 + k, static_cast<uint32_t>(t * 1000 + k)));
          works.push_back(pg->isend(TensorView::of(bufs.back()), 1, t));
        }
      for (auto& w : works) w->wait();
    } else {
      std::vector<std::vector<uint8_t>> bufs;
      std::vector<std::shared_ptr<Work>> works;
      std::vector<std::pair<int, int>> ids;
      bufs.reserve(kTags * kPerTag);
      // Half the receives now (probably before the data), half after a pause (unexpected).
      for (int t = kTags - 1; t >= kTags / 2; --t)
        for (int k = 0; k < kPerTag; ++k) {
          bufs.emplace_back(100 + t * 1000 + k);
          works.push_back(pg->irecv(TensorView::of(bufs.back()), 0, t));
          ids.emplace_back(t, k);
        }
      std::this_thread::sleep_for(200ms);
      for (int t = 0; t < kTags / 2; ++t)
        for (int k = 0; k < kPerTag; ++k) {
          bufs.emplace_back(100 + t * 1000 + k);
          works.push_back(pg->irecv(TensorView::of(bufs.back()), 0, t));
          ids.emplace_back(t, k);
        }
      // Wait in reverse order of posting.
      for (size_t i = works.size(); i-- > 0;) {
        works[i]->wait();
        auto [t, k] = ids[i];
        RANK_CHECK(bufs[i] == pattern(100 + t * 1000 + k, static_cast<uint32_t>(t * 1000 + k)),
                   "tag {} message {} differs", t, k);
      }
    }
  }));
}

// Messages that arrive before their receives are buffered, and the buffers of delivered ones
// are reused for later ones: batches of same-sized early messages must each come out intact (no
// bytes of an earlier message left behind). Then a receive posted while a large message is still
// arriving takes the rest of it straight into its own buffer.
TEST(TcpPair, EarlyMessagesComeOutIntactAndALateReceiveJoinsMidMessage) {
  const int port = free_port();
  constexpr int kBatches = 4, kPerBatch = 8;
  constexpr size_t kSmall = 256 << 10, kLarge = size_t{128} << 20;
  expect_all_ok(run_ranks(2, [&](int rank) {
    auto pg = tcp_group(rank, 2, port);
    auto large = pattern(kLarge, 77);
    std::vector<uint8_t> in(kLarge), ack(1);
    for (int b = 0; b < kBatches; ++b) {
      if (rank == 0) {
        std::vector<std::vector<uint8_t>> out;
        std::vector<std::shared_ptr<Work>> works;
        out.reserve(kPerBatch);
        for (int k = 0; k < kPerBatch; ++k) {
          out.push_back(pattern(kSmall, static_cast<uint32_t>(b * 100 + k)));
          works.push_back(pg->isend(TensorView::of(out.back()), 1, 5));
        }
        for (auto& w : works) w->wait();
        pg->recv(TensorView::of(ack), 1, 6);
      } else {
        std::this_thread::sleep_for(50ms);  // the batch is here before its receives
        for (int k = 0; k < kPerBatch; ++k) {
          std::vector<uint8_t> in(kSmall);
          pg->recv(TensorView::of(in), 0, 5);
          RANK_CHECK(in == pattern(kSmall, static_cast<uint32_t>(b * 100 + k)),
                     "batch {} message {} differs", b, k);
        }
        pg->send(TensorView::of(ack), 0, 6);
      }
    }
    if (rank == 0) {
      pg->send(TensorView::of(ack), 1, 7);
      pg->send(TensorView::of(large), 1, 8);
    } else {
      pg->recv(TensorView::of(ack), 0, 7);
      // Long enough for the first bytes to land, short of the whole message on this machine.
      std::this_thread::sleep_for(2ms);
      pg->recv(TensorView::of(in), 0, 8);
      RANK_CHECK(in == large, "the message joined mid-way differs");
    }
  }, 60s));
}

// A reducing receive (what the TCP all-reduces use for their reduce-scatter half) adds what
// arrives into the buffer: f64 sums posted before the data (elements split between two reads
// wait for their other half: the loopback segment size is odd), an i32 message that arrived
// whole before its receive (reduced out of the pair's buffer), an f16 receive joining a 32 MiB
// message mid-way, and sizes that are no whole number of elements refused. Values are exact, so
// any lost or doubled byte shows. Over shared memory the same through the rings, but messages of
// 32 MiB and more move in one cross-memory copy: the f64 one, whose receive is posted first, is
// pulled through the pair's buffer a piece at a time.
void reducing_receive(const char* transport) {
  const int port = free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    TwoRanks two(rank, port, transport);
    auto& pair = two.pair();
    const auto deadline = Deadline::after(30s);
    auto wait = [&](const std::shared_ptr<transport::Request>& r) {
      transport::wait_request(*r, deadline);
    };
    using Reduction = transport::Request::Reduction;
    std::vector<uint8_t> go(1);

    constexpr size_t kF64 = (size_t{32} << 20) / 8 + 7;  // on shm: cross-memory attach
    constexpr size_t kI32 = 300'001;
    constexpr size_t kF16 = (size_t{32} << 20) / 2;
    if (rank == 0) {
      std::vector<double> f64(kF64);
      for (size_t i = 0; i < kF64; ++i) f64[i] = 3.0 * static_cast<double>(i) + 0.5;
      std::vector<int32_t> i32(kI32);
      for (size_t i = 0; i < kI32; ++i) i32[i] = static_cast<int32_t>(i % 1000) - 500;
      std::vector<uint16_t> f16(kF16);
      for (size_t i = 0; i < kF16; ++i) f16[i] = f32_to_f16_bits(static_cast<float>((i * 7) % 1000));
      wait(pair.irecv(1, go.data(), 1, deadline));  // rank 1 has posted its f64 receive
      wait(pair.isend(2, f64.data(), kF64 * 8, deadline));
      wait(pair.isend(3, i32.data(), kI32 * 4, deadline));
      wait(pair.isend(7, go.data(), 1, deadline));
      wait(pair.irecv(4, go.data(), 1, deadline));
      wait(pair.isend(5, f16.data(), kF16 * 2, deadline));
    } else {
      std::vector<double> f64(kF64);
      for (size_t i = 0; i < kF64; ++i) f64[i] = static_cast<double>(i);
      auto r = pair.irecv_reduce(2, f64.data(), kF64 * 8, deadline, 0,
                                 Reduction{DType::kF64, ReduceOp::kSum});
      wait(pair.isend(1, go.data(), 1, deadline));
      wait(r);
      for (size_t i = 0; i < kF64; ++i)
        RANK_CHECK(f64[i] == 4.0 * static_cast<double>(i) + 0.5, "f64[{}] = {}", i, f64[i]);

      // The i32 message is read whole into a buffer of the pair before its receive is posted.
      wait(pair.irecv(7, go.data(), 1, deadline));
      std::vector<int32_t> i32(kI32, 17);
      wait(pair.irecv_reduce(3, i32.data(), kI32 * 4, deadline, 0,
                             Reduction{DType::kI32, ReduceOp::kMax}));
      for (size_t i = 0; i < kI32; ++i)
        RANK_CHECK(i32[i] == std::max<int32_t>(17, static_cast<int32_t>(i % 1000) - 500),
                   "i32[{}] = {}", i, i32[i]);

      std::vector<uint16_t> f16(kF16);
      for (size_t i = 0; i < kF16; ++i) f16[i] = f32_to_f16_bits(static_cast<float>(i % 1000));
      wait(pair.isend(4, go.data(), 1, deadline));
      // Long enough for the first bytes to land, short of the whole message on this machine.
      std::this_thread::sleep_for(2ms);
      wait(pair.irecv_reduce(5, f16.data(), kF16 * 2, deadline, 0,
                             Reduction{DType::kF16, ReduceOp::kSum}));
      for (size_t i = 0; i < kF16; ++i) {
        const float want = static_cast<float>(i % 1000 + (i * 7) % 1000);
        RANK_CHECK(f16_bits_to_f32(f16[i]) == want, "f16[{}] = {}, expected {}", i,
                   f16_bits_to_f32(f16[i]), want);
      }

      std::string error;
      try {
        pair.irecv_reduce(6, f64.data(), 12, deadline, 0, Reduction{DType::kF64, ReduceOp::kSum});
      } catch (const InvalidArgumentError& e) {
        error = e.what();
      }
      for (const char* part : {"rank 1:", "from rank 0", "12 bytes", "f64"})
        RANK_CHECK(error.find(part) != std::string::npos, "'{}' lacks '{}'", error, part);
    }
  }, 60s));
}

TEST(TcpPair, ReducingReceiveCombinesAsItArrives) { reducing_receive("tcp"); }
TEST(Shm, ReducingReceiveCombinesAsItArrives) { reducing_receive("shm"); }

// Both ranks send 64 MiB to each other at the same time before receiving: needs the transport
// to keep reading while it writes.
TEST(TcpPair, SimultaneousLargeExchange) {
  const int port = free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    auto pg = tcp_group(rank, 2, port);
    auto out = pattern(size_t{64} << 20, static_cast<uint32_t>(rank));
    std::vector<uint8_t> in(out.size());
    auto s = pg->isend(TensorView::of(out), 1 - rank);
    s->wait();
    pg->recv(TensorView::of(in), 1 - rank);
    RANK_CHECK(in == pattern(in.size(), static_cast<uint32_t>(1 - rank)), "exchange differs");
  }));
}

// After a collective, idle pairs are "parked" (out of the event loop; on shared memory, asking
// for no doorbells): early bytes wait for whoever reads them next. A rank that then sleeps
// waiting on another peer must still drain them, or this cycle deadlocks: rank 0's large send to
// rank 1 completes only once rank 1 takes it in, and only then does rank 0 tell rank 2, whose
// message rank 1 awaits. With `post_first`, rank 1 posts its receive of the large message
// before it sleeps on rank 2: a request posted on a parked pair leaves it parked (its poster
// usually waits on it next), and it must complete all the same.
void cycle_through_parked_pairs(const char* transport, bool post_first) {
  const int port = free_port();
  expect_all_ok(run_ranks(3, [&](int rank) {
    ProcessGroupOptions o;
    o.transport = transport;
    auto pg = make_group(rank, 3, port, o);
    auto big = pattern(size_t{8} << 20, 9);  // beyond the socket buffers and the rings
    std::vector<int32_t> token(1, 42);
    for (int round = 0; round < 3; ++round) {
      pg->barrier()->wait();  // touches every pair, which is then parked
      const auto start = std::chrono::steady_clock::now();
      if (rank == 0) {
        pg->isend(TensorView::of(big), 1, 7)->wait();
        pg->send(TensorView::of(token), 2, 8);
      } else if (rank == 2) {
        pg->recv(TensorView::of(token), 0, 8);
        pg->send(TensorView::of(token), 1, 9);
      } else {
        std::vector<uint8_t> got(big.size());
        std::shared_ptr<Work> pending;
        if (post_first) pending = pg->irecv(TensorView::of(got), 0, 7);
        pg->recv(TensorView::of(token), 2, 9);
        if (!pending) pending = pg->irecv(TensorView::of(got), 0, 7);
        pending->wait();
        RANK_CHECK(got == big && token[0] == 42, "round {}: payload differs", round);
      }
      const auto took = std::chrono::steady_clock::now() - start;
      RANK_CHECK(took < 5s, "round {} took {} ms", round,
                 std::chrono::duration_cast<std::chrono::milliseconds>(took).count());
    }
  }, 60s));
}

TEST(TcpPair, ParkedPairsDrainWhileTheRankWaitsOnAnotherPeer) {
  cycle_through_parked_pairs("tcp", false);
}
TEST(TcpPair, PostedOnAParkedPairAndWaitedOnLastStillCompletes) {
  cycle_through_parked_pairs("tcp", true);
}
TEST(Shm, PostedOnAParkedPairAndWaitedOnLastStillCompletes) {
  cycle_through_parked_pairs("shm", true);
}

// Every rank sends to every other rank: the full mesh of 4 processes.
TEST(TcpPair, FullMeshOfFour) {
  const int port = free_port();
  expect_all_ok(run_ranks(4, [&](int rank) {
    auto pg = tcp_group(rank, 4, port);
    std::vector<std::vector<int32_t>> out(4, std::vector<int32_t>(1000)), in = out;
    std::vector<std::shared_ptr<Work>> works;
    for (int peer = 0; peer < 4; ++peer) {
      if (peer == rank) continue;
      for (int i = 0; i < 1000; ++i) out[peer][i] = rank * 100000 + peer * 1000 + i;
      works.push_back(pg->isend(TensorView::of(out[peer]), peer));
      works.push_back(pg->irecv(TensorView::of(in[peer]), peer));
    }
    for (auto& w : works) w->wait();
    for (int peer = 0; peer < 4; ++peer) {
      if (peer == rank) continue;
      for (int i = 0; i < 1000; ++i)
        RANK_CHECK(in[peer][i] == peer * 100000 + rank * 1000 + i, "from rank {} [{}]", peer, i);
    }
  }));
}

TEST(TcpPair, SizeMismatchIsNamedAndConnectionSurvives) {
  const int port = free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    auto pg = tcp_group(rank, 2, port);
    std::vector<uint8_t> big(4096, 1), small(1024), ok(8, 9);
    if (rank == 0) {
      pg->send(TensorView::of(big), 1, 7);
      pg->send(TensorView::of(ok), 1, 8);
    } else {
      try {
        pg->recv(TensorView::of(small), 0, 7);
        RANK_CHECK(false, "a 1024-byte receive accepted a 4096-byte message");
      } catch (const InvalidArgumentError& e) {
        std::string m = e.what();
        RANK_CHECK(m.find("rank 1") != std::string::npos && m.find("4096") != std::string::npos &&
                       m.find("1024") != std::string::npos && m.find("tag 7") != std::string::npos,
                   "message lacks detail: {}", m);
      }
      std::vector<uint8_t> got(8);
      pg->recv(TensorView::of(got), 0, 8);
      RANK_CHECK(got == ok, "message after the mismatch differs");
    }
  }));
}

TEST(TcpPair, RecvTimeoutNamesPeerAndTagThenPairStillWorks) {
  const int port = free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    auto pg = tcp_group(rank, 2, port);
    std::vector<float> v(16, 1.5f);
    if (rank == 1) {
      auto start = std::chrono::steady_clock::now();
      try {
        pg->recv(TensorView::of(v), 0, 5, RecvOptions{300ms});
        RANK_CHECK(false, "recv returned without a sender");
      } catch (const TimeoutError& e) {
        std::string m = e.what();
        RANK_CHECK(m.find("rank 1") != std::string::npos && m.find("rank 0") != std::string::npos &&
                       m.find("tag 5") != std::string::npos && m.find("64 bytes") != std::string::npos &&
                       m.find("limit") != std::string::npos,
                   "message lacks detail: {}", m);
      }
      auto waited = std::chrono::steady_clock::now() - start;
      RANK_CHECK(waited >= 250ms, "timed out too early");
      pg->send(TensorView::of(v), 0, 6);  // tell rank 0 to go on
      pg->recv(TensorView::of(v), 0, 5);  // the pair still works after the timeout
      RANK_CHECK(v[3] == 2.5f, "value {}", v[3]);
    } else {
      pg->recv(TensorView::of(v), 1, 6);
      std::fill(v.begin(), v.end(), 2.5f);
      pg->send(TensorView::of(v), 1, 5);
    }
  }));
}

// SIGKILL one rank in the middle of a large transfer: the survivor fails quickly with an error
// naming the dead rank, and later operations fail at once.
TEST(TcpPair, KilledPeerFailsSurvivorQuickly) {
  const int port = free_port();
  auto results = run_ranks(2, [&](int rank) {
    auto pg = tcp_group(rank, 2, port, {}, 60s);
    std::vector<uint8_t> buf(size_t{512} << 20, 3);
    if (rank == 1) {
      std::vector<uint8_t> small(4);
      pg->recv(TensorView::of(small), 0, 1);  // rank 0 is about to send the big one
      auto w = pg->irecv(TensorView::of(buf), 0, 2);
      std::this_thread::sleep_for(20ms);
      ::raise(SIGKILL);
    }
    std::vector<uint8_t> small(4, 1);
    pg->send(TensorView::of(small), 1, 1);
    auto start = std::chrono::steady_clock::now();
    try {
      pg->send(TensorView::of(buf), 1, 2);
      pg->recv(TensorView::of(small), 1, 3);
      RANK_CHECK(false, "operations with a killed peer succeeded");
    } catch (const PeerFailureError& e) {
      auto elapsed = std::chrono::steady_clock::now() - start;
      std::string m = e.what();
      RANK_CHECK(m.find("rank 0") != std::string::npos && m.find("rank 1") != std::string::npos &&
                     m.find("127.0.0.1") != std::string::npos && m.find("bytes") != std::string::npos,
                 "message lacks detail: {}", m);
      RANK_CHECK(elapsed < 10s, "took {} ms to notice", std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count());
    }
    // Later operations fail immediately, naming the broken connection.
    try {
      pg->send(TensorView::of(small), 1, 4);
      RANK_CHECK(false, "send after the failure succeeded");
    } catch (const PeerFailureError& e) {
      RANK_CHECK(std::string(e.what()).find("cannot start") != std::string::npos, "{}", e.what());
    }
    ::_exit(3);  // "failed as expected"
  }, 60s);
  EXPECT_EQ(results[1].signal, SIGKILL);
  EXPECT_EQ(results[0].exit_code, 3) << "rank 0 did not notice the dead peer as expected";
}

TEST(TcpPair, AbortFailsPendingAtOnce) {
  const int port = free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    auto pg = tcp_group(rank, 2, port);
    std::vector<uint8_t> b(10);
    if (rank == 0) {
      auto w = pg->irecv(TensorView::of(b), 1, 9);
      std::thread aborter([&] {
        std::this_thread::sleep_for(100ms);
        pg->abort("test says stop");
      });
      try {
        w->wait();
        RANK_CHECK(false, "wait returned after abort");
      } catch (const AbortedError& e) {
        RANK_CHECK(std::string(e.what()).find("test says stop") != std::string::npos, "{}", e.what());
      }
      aborter.join();
      RANK_CHECK(w->is_completed() && !w->is_success(), "aborted work not completed with error");
    } else {
      // Rank 0's abort closes its connections: this rank's receive fails, naming rank 0.
      try {
        pg->recv(TensorView::of(b), 0, 11);
        RANK_CHECK(false, "recv from an aborted rank succeeded");
      } catch (const PeerFailureError& e) {
        RANK_CHECK(std::string(e.what()).find("rank 0") != std::string::npos, "{}", e.what());
      }
    }
  }));
}

// A peer that reports collective #2 of a group failed has completed #1: a rank still in #1
// receives what #1 waits for and completes it (it used to fail #1, naming the wrong call);
// #2 and later, and the group's point-to-point messages, fail with the peer's report; other
// groups go on. A report that names no collective (an abort) fails everything of the group.
TEST(TcpPair, AFailureReportedForACollectiveSparesTheGroupsEarlierOnes) {
  const int port = free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    TwoRanks ranks(rank, port, "auto");
    auto& device = ranks.device;
    auto& pair = ranks.pair();
    const auto deadline = Deadline::after(30s);
    auto wait = [&](const std::shared_ptr<transport::Request>& r) {
      transport::wait_request(*r, deadline);
    };
    using transport::TagSpace, transport::make_tag;
    constexpr uint32_t kGroup = 5, kOther = 6, kAborted = 7;
    std::vector<int32_t> one(4, 11), two(4, 22), other(4, 66), got(4, 0);
    if (rank == 0) {
      wait(pair.irecv(make_tag(TagSpace::kPointToPoint, kOther, 0), got.data(), 1, deadline));
      const std::string report = "rank 0 reports: collective #2 of group g failed here";
      device.fail_group(kGroup, make_tag(TagSpace::kCollective, kGroup, 2), {1},
                        std::make_exception_ptr(PeerFailureError(report)), report);
      // The notice went first on this stream; #1's messages follow it.
      wait(pair.isend(make_tag(TagSpace::kCollective, kGroup, 1), one.data(), 16, deadline));
      wait(pair.isend(make_tag(TagSpace::kCollective, kGroup, 1), two.data(), 16, deadline));
      wait(pair.isend(make_tag(TagSpace::kPointToPoint, kOther, 3), other.data(), 16, deadline));
      device.fail_group(kAborted, make_tag(TagSpace::kCollective, kAborted, 0), {1},
                        std::make_exception_ptr(AbortedError("rank 0 aborted")), "rank 0 aborted");
      wait(pair.irecv(make_tag(TagSpace::kPointToPoint, kOther, 4), got.data(), 1, deadline));
    } else {
      auto first = pair.irecv(make_tag(TagSpace::kCollective, kGroup, 1), got.data(), 16, deadline);
      auto aborted =
          pair.irecv(make_tag(TagSpace::kCollective, kAborted, 1), got.data(), 16, deadline);
      wait(pair.isend(make_tag(TagSpace::kPointToPoint, kOther, 0), got.data(), 1, deadline));
      wait(first);
      RANK_CHECK(got == one, "#1's first message: {}", got[0]);
      // Posted after the report arrived: still #1's, so it runs.
      wait(pair.irecv(make_tag(TagSpace::kCollective, kGroup, 1), got.data(), 16, deadline));
      RANK_CHECK(got == two, "#1's second message: {}", got[0]);
      auto fails = [&](uint64_t tag, const char* part) {
        std::string error;
        try {
          wait(pair.irecv(tag, got.data(), 16, deadline));
        } catch (const Error& e) {
          error = e.what();
        }
        RANK_CHECK(error.find(part) != std::string::npos, "tag {:x}: '{}' lacks '{}'", tag, error,
                   part);
      };
      fails(make_tag(TagSpace::kCollective, kGroup, 2), "collective #2 of group g failed here");
      fails(make_tag(TagSpace::kCollective, kGroup, 3), "collective #2 of group g failed here");
      fails(make_tag(TagSpace::kPointToPoint, kGroup, 1), "collective #2 of group g failed here");
      wait(pair.irecv(make_tag(TagSpace::kPointToPoint, kOther, 3), got.data(), 16, deadline));
      RANK_CHECK(got == other, "another group's message: {}", got[0]);
      std::string error;
      try {
        wait(aborted);
      } catch (const Error& e) {
        error = e.what();
      }
      RANK_CHECK(error.find("rank 0 aborted") != std::string::npos, "#1 of the aborted group: '{}'",
                 error);
      wait(pair.isend(make_tag(TagSpace::kPointToPoint, kOther, 4), got.data(), 1, deadline));
    }
  }, 60s));
}

TEST(TcpPair, AuthTokenOnDataConnections) {
  const int port = free_port();
  expect_all_ok(run_ranks(3, [&](int rank) {
    ::setenv("DTRAIN_AUTH_TOKEN", "s3cret", 1);
    auto pg = tcp_group(rank, 3, port);
    std::vector<int32_t> v(3, rank);
    if (rank == 0) {
      pg->recv(TensorView::of(v), 2);
      RANK_CHECK(v[0] == 2, "got {}", v[0]);
    } else if (rank == 2) {
      pg->send(TensorView::of(v), 0);
    }
  }));
}

// A rank of another job cannot join: the rendezvous fails with the missing rank named.
TEST(TcpPair, RankOfAnotherJobIsRefused) {
  const int port = free_port();
  auto results = run_ranks(2, [&](int rank) {
    ProcessGroupOptions o;
    o.connect_timeout = 2s;
    o.job_id = "job-b";
    if (rank == 0) o.job_id = "job-a";
    // The store checks job ids too: give both the same store job by leaving it to defaults.
    try {
      auto pg = tcp_group(rank, 2, port, o);
      RANK_CHECK(false, "ranks of different jobs connected");
    } catch (const Error& e) {
      std::string m = e.what();
      if (rank == 0)
        RANK_CHECK(m.find("rank(s) 1") != std::string::npos, "rank 0's error: {}", m);
      else
        RANK_CHECK(m.find("job id") != std::string::npos, "rank 1's error: {}", m);
    }
  }, 30s);
  expect_all_ok(results);
}

TEST(TcpPair, WorldOfOneAndBadPeers) {
  const int port = free_port();
  expect_all_ok(run_ranks(1, [&](int rank) {
    auto pg = tcp_group(rank, 1, port);
    RANK_CHECK(pg->size() == 1 && pg->rank() == 0, "bad identity");
    std::vector<float> v(4);
    try {
      pg->send(TensorView::of(v), 0);
      RANK_CHECK(false, "send to self accepted");
    } catch (const InvalidArgumentError&) {
    }
    try {
      pg->send(TensorView::of(v), 3);
      RANK_CHECK(false, "send to rank 3 of 1 accepted");
    } catch (const InvalidArgumentError& e) {
      RANK_CHECK(std::string(e.what()).find("0..0") != std::string::npos, "{}", e.what());
    }
  }));
}

}  // namespace
}  // namespace dtrain::testing
