// TcpStore and TcpStoreServer specifics: ports, large values, threads sharing a client, the
// handshake (other jobs, other versions, tokens), garbage on the port, stop(), and what the
// errors say.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "common/handshake.h"
#include "common/socket.h"
#include "store/store_protocol.h"
#include "store/store_test_util.h"
#include "support/peer_closed.h"

namespace dtrain::testing {
namespace {

using namespace std::chrono_literals;

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A raw TCP connection to the server, for speaking out of turn.
net::Fd raw_connect(uint16_t port) {
  return net::connect_tcp(net::HostPort{"127.0.0.1", port}, Deadline::after(5s), "test");
}

// The server still does its job for a well-behaved client.
void expect_serving(uint16_t port, const std::string& token = "") {
  TcpStore good(client_options(port, 9, token));
  good.set("still/serving", std::string_view("yes"));
  EXPECT_EQ(good.get_string("still/serving"), "yes");
}

TEST(TcpStore, PortZeroReportsTheRealPortAndLocalIp) {
  TcpStoreOptions options = client_options(0);
  options.is_server = true;
  TcpStore host(options);
  ASSERT_NE(host.port(), 0);
  EXPECT_EQ(host.host(), "127.0.0.1");
  EXPECT_EQ(host.local_ip(), "127.0.0.1");
  TcpStore client(client_options(host.port(), 1));
  host.set("k", std::string_view("v"));
  EXPECT_EQ(client.get_string("k"), "v");
}

TEST(TcpStore, SixtyFourMiBValueRoundTrip) {
  auto server = start_server();
  TcpStore a(client_options(server->port(), 0));
  TcpStore b(client_options(server->port(), 1));
  Bytes big(64 << 20);
  std::mt19937_64 rng(42);
  for (size_t i = 0; i + 8 <= big.size(); i += 8) {
    uint64_t r = rng();
    std::memcpy(big.data() + i, &r, 8);
  }
  auto start = Clock::now();
  a.set("big", big);
  Bytes got = b.get("big");
  EXPECT_LT(Clock::now() - start, 30s);
  ASSERT_EQ(got.size(), big.size());
  EXPECT_TRUE(got == big);
  auto both = b.multi_get({"big", "big"});
  EXPECT_TRUE(both[0] == big && both[1] == big);
}

TEST(TcpStore, ThreadsShareOneClient) {
  auto server = start_server();
  TcpStore store(client_options(server->port()));
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < 8; ++t)
      threads.emplace_back([&, t] {
        for (int i = 0; i < 200; ++i) store.add("shared", 1);
        store.set(fmt::format("t{}", t), std::to_string(t));
      });
  }
  EXPECT_EQ(store.add("shared", 0), 1600);
  EXPECT_EQ(store.get_string("t7"), "7");
}

TEST(TcpStore, ServerTimeoutMessageNamesRankAddressCallAndKeys) {
  auto server = start_server();
  TcpStore store(client_options(server->port(), 3));
  store.set_timeout(300ms);
  std::string m = message_of([&] { store.get("addr/5"); });
  EXPECT_TRUE(contains(m, fmt::format("rank 3: store 127.0.0.1:{}", server->port()))) << m;
  EXPECT_TRUE(contains(m, "get(\"addr/5\") timed out after")) << m;
  EXPECT_TRUE(contains(m, "of a 0.3 s limit")) << m;
  EXPECT_TRUE(contains(m, "1 of 1 key(s) still missing: \"addr/5\"")) << m;
}

TEST(TcpStore, ConnectTimeoutNamesTheAddress) {
  const uint16_t port = static_cast<uint16_t>(free_port());  // nobody listens there
  TcpStoreOptions options = client_options(port, 7);
  options.connect_timeout = 300ms;
  auto start = Clock::now();
  std::string m;
  try {
    TcpStore store(options);
  } catch (const TimeoutError& e) {
    m = e.what();
  }
  EXPECT_TRUE(contains(m, "rank 7")) << m;
  EXPECT_TRUE(contains(m, fmt::format("127.0.0.1:{}", port))) << m;
  EXPECT_LT(Clock::now() - start, 5s);
}

TEST(TcpStore, ServerGoneIsAStoreErrorThenTheClientStaysBroken) {
  auto server = start_server();
  TcpStore store(client_options(server->port(), 2));
  store.set("a", std::string_view("1"));
  server->stop();
  std::string first = message_of([&] { store.set("b", std::string_view("2")); });
  EXPECT_TRUE(contains(first, "rank 2")) << first;
  EXPECT_TRUE(contains(first, "lost the connection during set(\"b\")")) << first;
  EXPECT_THROW(store.get("a"), StoreError);
  std::string later = message_of([&] { store.get("a"); });
  EXPECT_TRUE(contains(later, "broke earlier")) << later;
}

// stop() wakes a client blocked in a long wait, and returns promptly.
TEST(TcpStore, StopWakesWaitingClients) {
  auto server = start_server();
  TcpStore store(client_options(server->port()));
  std::string error;
  std::jthread waiter([&] { error = message_of([&] { store.wait({"never"}, 60s); }); });
  std::this_thread::sleep_for(200ms);  // let the wait reach the server; the result holds either way
  auto start = Clock::now();
  server->stop();
  waiter.join();
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_FALSE(contains(error, "no exception")) << error;
  server.reset();  // a second stop (from the destructor) is harmless
}

TEST(TcpStoreHandshake, RefusesAnotherJob) {
  auto server = start_server("", "job-a");
  std::string m;
  try {
    TcpStore intruder(client_options(server->port(), 4, "", "job-b"));
  } catch (const StoreError& e) {
    m = e.what();
  }
  EXPECT_TRUE(contains(m, "refused")) << m;
  EXPECT_TRUE(contains(m, "job id 'job-b'")) << m;
  EXPECT_TRUE(contains(m, "rank 4")) << m;
  TcpStore good(client_options(server->port(), 0, "", "job-a"));
  good.set("k", std::string_view("v"));
  EXPECT_EQ(good.get_string("k"), "v");
}

TEST(TcpStoreHandshake, RefusesAnotherProtocolVersion) {
  auto server = start_server();
  net::Fd fd = raw_connect(server->port());
  // A hello as handshake.cc lays it out (packed): magic, version, role, has_token, rank,
  // peer_rank, tag, job id length, nonce; then the job id.
  std::vector<uint8_t> hello;
  auto put = [&](const void* p, size_t n) {
    auto* b = static_cast<const uint8_t*>(p);
    hello.insert(hello.end(), b, b + n);
  };
  uint32_t magic = net::kMagic;
  uint16_t version = 99;
  uint8_t role = static_cast<uint8_t>(net::Role::kStoreClient), has_token = 0;
  int32_t rank = 5, peer_rank = -1;
  uint64_t tag = 0;
  std::string job = kTestJob;
  uint16_t job_len = static_cast<uint16_t>(job.size());
  uint8_t nonce[16] = {};
  put(&magic, 4), put(&version, 2), put(&role, 1), put(&has_token, 1), put(&rank, 4);
  put(&peer_rank, 4), put(&tag, 8), put(&job_len, 2), put(nonce, 16), put(job.data(), job.size());
  ASSERT_EQ(hello.size(), 42u + job.size());
  net::write_all(fd.get(), hello.data(), hello.size(), Deadline::after(5s), "test");
  // The reply: magic u32, version u16, accepted u8, auth u8, rank i32, nonce[16], reason
  // length u16, then the reason.
  uint8_t reply[30];
  net::read_all(fd.get(), reply, sizeof(reply), Deadline::after(5s), "test");
  uint32_t reply_magic;
  std::memcpy(&reply_magic, reply, 4);
  EXPECT_EQ(reply_magic, net::kMagic);
  EXPECT_EQ(reply[6], 0) << "a hello of protocol version 99 was accepted";
  uint16_t reason_len;
  std::memcpy(&reason_len, reply + 28, 2);
  std::string reason(reason_len, '\0');
  net::read_all(fd.get(), reason.data(), reason.size(), Deadline::after(5s), "test");
  EXPECT_TRUE(contains(reason, "protocol version 99")) << reason;
  EXPECT_TRUE(closed_by_peer(fd.get(), 5s));
  expect_serving(server->port());
}

TEST(TcpStoreHandshake, GarbageBytesAreDropped) {
  auto server = start_server("", kTestJob, std::chrono::milliseconds(1000));
  std::mt19937 rng(7);
  for (int round = 0; round < 3; ++round) {
    net::Fd fd = raw_connect(server->port());
    std::vector<uint8_t> junk(4096);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    junk[0] = 'G';  // never the magic by chance
    net::write_all(fd.get(), junk.data(), junk.size(), Deadline::after(5s), "test");
    EXPECT_TRUE(closed_by_peer(fd.get(), 5s));
  }
  // A connection that says nothing at all is dropped at the handshake timeout, not kept forever;
  // meanwhile everyone else is served.
  net::Fd silent = raw_connect(server->port());
  expect_serving(server->port());
  EXPECT_TRUE(closed_by_peer(silent.get(), 5s));
  expect_serving(server->port());
}

// A client that passes the handshake and then sends nonsense loses only its own connection.
TEST(TcpStoreHandshake, GarbageAfterTheHandshakeIsDropped) {
  auto server = start_server();
  auto handshaken = [&] {
    net::Fd fd = raw_connect(server->port());
    net::handshake_connect(fd.get(), net::HandshakeConfig{kTestJob, ""}, net::Hello{}, -1,
                           Deadline::after(5s), "test");
    return fd;
  };
  auto u64 = [](std::vector<uint8_t>& out, uint64_t v) {
    auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + 8);
  };
  {  // an unknown command
    net::Fd fd = handshaken();
    uint8_t junk[] = {0xee, 1, 2, 3};
    net::write_all(fd.get(), junk, sizeof(junk), Deadline::after(5s), "test");
    EXPECT_TRUE(closed_by_peer(fd.get(), 5s));
  }
  {  // a key claiming 2^62 bytes
    net::Fd fd = handshaken();
    std::vector<uint8_t> req = {static_cast<uint8_t>(store::Command::kGet)};
    u64(req, 0), u64(req, 0), u64(req, 1), u64(req, uint64_t{1} << 62);
    net::write_all(fd.get(), req.data(), req.size(), Deadline::after(5s), "test");
    EXPECT_TRUE(closed_by_peer(fd.get(), 5s));
  }
  {  // a well-formed request of the wrong shape is answered with an error, and serving goes on
    net::Fd fd = handshaken();
    store::Request bad{.command = store::Command::kSet, .keys = {"a", "b"}};
    auto bytes = store::encode_request(bad);
    net::write_all(fd.get(), bytes.data(), bytes.size(), Deadline::after(5s), "test");
    auto resp = store::read_response(fd.get(), Deadline::after(5s), "test");
    EXPECT_EQ(resp.status, store::Status::kError);
    EXPECT_TRUE(contains(resp.error, "malformed set request")) << resp.error;
    auto ok = store::encode_request(store::Request{.command = store::Command::kNumKeys});
    net::write_all(fd.get(), ok.data(), ok.size(), Deadline::after(5s), "test");
    EXPECT_EQ(store::read_response(fd.get(), Deadline::after(5s), "test").status,
              store::Status::kOk);
  }
  {  // half a request, then gone
    net::Fd fd = handshaken();
    auto bytes = store::encode_request(store::Request{
        .command = store::Command::kSet, .keys = {"half"}, .values = {to_bytes("value")}});
    net::write_all(fd.get(), bytes.data(), bytes.size() / 2, Deadline::after(5s), "test");
  }
  expect_serving(server->port());
  TcpStore check(client_options(server->port()));
  EXPECT_FALSE(check.check({"half"}));
}

TEST(TcpStoreAuth, SameTokenWorks) {
  auto server = start_server("s3cret");
  TcpStore a(client_options(server->port(), 0, "s3cret"));
  TcpStore b(client_options(server->port(), 1, "s3cret"));
  a.set("k", std::string_view("v"));
  EXPECT_EQ(b.get_string("k"), "v");
}

TEST(TcpStoreAuth, TokenFromTheEnvironment) {
  auto server = start_server("env-token");
  ::setenv("DTRAIN_AUTH_TOKEN", "env-token", 1);
  std::string m = message_of([&] {
    TcpStore a(client_options(server->port(), 0));  // no token in the options
    a.set("k", std::string_view("v"));
  });
  ::unsetenv("DTRAIN_AUTH_TOKEN");
  EXPECT_EQ(m, "(no exception)");
}

TEST(TcpStoreAuth, MissingTokenIsRefusedWithAHint) {
  auto server = start_server("s3cret");
  std::string m;
  try {
    TcpStore a(client_options(server->port(), 6));
  } catch (const StoreError& e) {
    m = e.what();
  }
  EXPECT_TRUE(contains(m, "set DTRAIN_AUTH_TOKEN")) << m;
  EXPECT_TRUE(contains(m, "rank 6")) << m;
  expect_serving(server->port(), "s3cret");
}

TEST(TcpStoreAuth, WrongTokenIsRefused) {
  auto server = start_server("s3cret");
  std::string m;
  try {
    TcpStore a(client_options(server->port(), 6, "guess"));
  } catch (const StoreError& e) {
    m = e.what();
  }
  EXPECT_TRUE(contains(m, "refused")) << m;
  EXPECT_TRUE(contains(m, "token")) << m;
  expect_serving(server->port(), "s3cret");
}

TEST(TcpStoreAuth, OffOnBothSidesWorks) {
  auto server = start_server();
  TcpStore a(client_options(server->port()));
  a.set("k", std::string_view("v"));
  EXPECT_EQ(a.get_string("k"), "v");
}

// A client with a token refuses a server that cannot prove it knows it.
TEST(TcpStoreAuth, ClientTokenWithoutServerTokenIsRefused) {
  auto server = start_server();
  std::string m;
  try {
    TcpStore a(client_options(server->port(), 0, "s3cret"));
  } catch (const StoreError& e) {
    m = e.what();
  }
  EXPECT_TRUE(contains(m, "does not authenticate")) << m;
  expect_serving(server->port());
}

// Silent connections cannot keep a real client out: with 128 file descriptors and torch
// clients served (as under `dtrain run`, where a silent socket is held without a time limit),
// 300 silent connections used to take every descriptor; now the oldest of them are closed to
// make room and a real client connects at once.
TEST(TcpStoreHandshake, SilentConnectionsDoNotKeepARealClientOut) {
  ServerProcess server("", kTestJob, /*max_files=*/128, /*torch_clients=*/true);
  std::vector<net::Fd> silent;
  for (int i = 0; i < 300; ++i) {
    try {
      silent.push_back(raw_connect(server.port()));
    } catch (const std::exception&) {
      // The kernel's backlog may refuse some while the server closes others: fine.
    }
  }
  const auto start = std::chrono::steady_clock::now();
  TcpStore client(client_options(server.port(), 1));
  client.set("k", std::string_view("v"));
  EXPECT_EQ(client.get_string("k"), "v");
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 2.0) << "300 silent connections kept a real client out for " << took << " s";
}

// What is closed to make room is a silent connection, not one that has begun its handshake:
// a real client sends its whole hello at once, so one that has spoken is closed last.
TEST(TcpStoreHandshake, ConnectionsThatSpokeAreNotClosedToMakeRoomForSilentOnes) {
  ServerProcess server("", kTestJob, /*max_files=*/128, /*torch_clients=*/true);  // 32 unproven
  net::Fd speaking = raw_connect(server.port());
  const char part_of_a_hello[] = {'D', 'T'};
  ASSERT_EQ(::send(speaking.get(), part_of_a_hello, 2, 0), 2);
  std::this_thread::sleep_for(100ms);  // its thread has seen the bytes
  std::vector<net::Fd> silent;
  for (int i = 0; i < 100; ++i) silent.push_back(raw_connect(server.port()));
  EXPECT_TRUE(closed_by_peer(silent.front().get(), 5s)) << "the oldest silent one is open";
  EXPECT_FALSE(closed_by_peer(speaking.get(), 300ms))
      << "the connection in mid-hello was closed to make room for silent ones";
}

}  // namespace
}  // namespace dtrain::testing
