// The store server speaking torch's TCPStore protocols (torch 2.x and 1.13) beside its own, over
// real sockets: the byte layouts torch's clients send and expect, a WAIT answered when another
// client (a dtrain one, even) sets the key, 2.x's CANCEL_WAIT and BARRIER, the silent second
// connection 1.13 opens, how the protocols are told apart, and what is refused. The end-to-end
// check with torch's own 2.x client is tests/python/test_torch_store.py.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include "common/log.h"
#include "common/socket.h"
#include "store/store_test_util.h"

namespace dtrain::testing {
namespace {

using namespace std::chrono_literals;

// A client that writes torch's requests byte by byte, as torch's does (in pieces).
class TorchClient {
 public:
  explicit TorchClient(uint16_t port)
      : fd_(net::connect_tcp(net::HostPort{"127.0.0.1", port}, Deadline::after(5s), "torch")) {}
  TorchClient& u8(uint8_t v) { return put(&v, 1); }
  TorchClient& u32(uint32_t v) { return put(&v, 4); }
  TorchClient& u64(uint64_t v) { return put(&v, 8); }
  TorchClient& str(const std::string& s) {
    u64(s.size());
    return put(s.data(), s.size());
  }
  uint8_t read_u8() {
    uint8_t v;
    net::read_all(fd_.get(), &v, 1, Deadline::after(5s), "torch");
    return v;
  }
  uint32_t read_u32() {
    uint32_t v;
    net::read_all(fd_.get(), &v, 4, Deadline::after(5s), "torch");
    return v;
  }
  int64_t read_i64() {
    int64_t v;
    net::read_all(fd_.get(), &v, 8, Deadline::after(5s), "torch");
    return v;
  }
  std::string read_str() {
    uint64_t n = static_cast<uint64_t>(read_i64());
    std::string s(n, '\0');
    if (n > 0) net::read_all(fd_.get(), s.data(), n, Deadline::after(5s), "torch");
    return s;
  }
  // True when nothing arrives within `limit`.
  bool silent_for(std::chrono::milliseconds limit) {
    pollfd p{fd_.get(), POLLIN, 0};
    return ::poll(&p, 1, static_cast<int>(limit.count())) == 0;
  }
  bool closed_within(std::chrono::milliseconds limit) {
    pollfd p{fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(limit.count())) != 1) return false;
    char b;
    return ::recv(fd_.get(), &b, 1, 0) <= 0;
  }

 private:
  TorchClient& put(const void* p, size_t n) {
    net::write_all(fd_.get(), p, n, Deadline::after(5s), "torch");
    return *this;
  }
  net::Fd fd_;
};

// torch 1.13's queries.
enum Q : uint8_t { SET = 0, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, WATCH_KEY, DELETE_KEY };

// torch 2.x's (TCPStoreBackend.hpp's QueryType).
namespace q2 {
enum Q2 : uint8_t {
  VALIDATE = 0,
  SET,
  COMPARE_SET,
  GET,
  ADD,
  CHECK,
  WAIT,
  GETNUMKEYS,
  DELETE_KEY,
  APPEND,
  MULTI_GET,
  MULTI_SET,
  CANCEL_WAIT,
  PING,
  QUEUE_PUSH,
  QUEUE_POP,
  QUEUE_LEN,
  LIST_KEYS,
  BARRIER,
};
constexpr uint32_t kMagic = 0x3C85F7CE;
constexpr uint8_t STOP_WAITING = 0, WAIT_CANCELED = 1;
}  // namespace q2

// A torch 2.x client, opened as torch's TCPStore opens one: VALIDATE with the magic, then PING.
TorchClient torch2_client(uint16_t port) {
  TorchClient c(port);
  c.u8(q2::VALIDATE).u32(q2::kMagic).u8(q2::PING).u32(0x1310);
  EXPECT_EQ(c.read_u32(), 0x1310u);
  return c;
}

// The store server's log lines while it lives (added to dtrain's logger, removed at the end).
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    log::logger().sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = log::logger().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  std::string text() {
    sink_->flush();
    return out_.str();
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

TcpStoreServer torch_server(const std::string& token = "") {
  TcpStoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.token = token;
  o.job_id = "store-test";  // what client_options() says
  o.torch_clients = true;
  o.handshake_timeout = 300ms;
  return TcpStoreServer(o);
}

TEST(TorchStoreProtocol, EveryQueryAsTorchSendsIt) {
  auto server = torch_server();
  TorchClient c(server.port());
  c.u8(ADD).str("init/").u64(1);
  EXPECT_EQ(c.read_i64(), 1);
  c.u8(SET).str("/k").str("value");  // no reply
  c.u8(GET).str("/k");
  EXPECT_EQ(c.read_str(), "value");
  c.u8(ADD).str("/n").u64(static_cast<uint64_t>(-5));
  EXPECT_EQ(c.read_i64(), -5);
  c.u8(GET).str("/n");
  EXPECT_EQ(c.read_str(), "-5");  // decimal text, as torch stores counters
  c.u8(CHECK).u64(2).str("/k").str("/n");
  EXPECT_EQ(c.read_u8(), 0);  // ready
  c.u8(CHECK).u64(1).str("/missing");
  EXPECT_EQ(c.read_u8(), 1);  // not ready
  c.u8(COMPARE_SET).str("/k").str("value").str("new");
  EXPECT_EQ(c.read_str(), "new");
  c.u8(COMPARE_SET).str("/k").str("wrong").str("other");
  EXPECT_EQ(c.read_str(), "new");
  c.u8(COMPARE_SET).str("/absent").str("expected").str("x");
  EXPECT_EQ(c.read_str(), "expected");  // torch's answer for a missing key
  c.u8(GETNUMKEYS);
  EXPECT_EQ(c.read_i64(), 3);  // init/, /k, /n
  c.u8(DELETE_KEY).str("/k");
  EXPECT_EQ(c.read_i64(), 1);
  c.u8(DELETE_KEY).str("/k");
  EXPECT_EQ(c.read_i64(), 0);
  c.u8(WAIT).u64(0);
  EXPECT_EQ(c.read_u8(), 0);
}

TEST(TorchStoreProtocol, AWaitIsAnsweredWhenADtrainClientSetsTheKey) {
  auto server = torch_server();
  TorchClient c(server.port());
  c.u8(WAIT).u64(2).str("/a").str("/b");
  TcpStore dtrain_client(client_options(server.port(), 0));
  dtrain_client.set("/a", std::string_view("1"));
  EXPECT_TRUE(c.silent_for(700ms)) << "answered before every key existed";
  dtrain_client.set("/b", std::string_view("2"));
  EXPECT_EQ(c.read_u8(), 0);
  c.u8(GET).str("/b");
  EXPECT_EQ(c.read_str(), "2");
}

TEST(TorchStoreProtocol, TheSilentSecondConnectionIsHeldAndDtrainClientsStillWork) {
  auto server = torch_server();
  TorchClient silent(server.port());
  // Past the handshake timeout (300 ms): a dtrain connection would be closed by now.
  EXPECT_TRUE(silent.silent_for(900ms));
  EXPECT_FALSE(silent.closed_within(50ms));
  TcpStore dtrain_client(client_options(server.port(), 0));
  dtrain_client.set("x", std::string_view("y"));
  EXPECT_EQ(dtrain_client.get_string("x"), "y");
}

TEST(TorchStoreProtocol, WhatTorchsServerRefusesClosesTheConnection) {
  auto server = torch_server();
  {
    TorchClient c(server.port());
    c.u8(GET).str("/never-set");  // torch's client always WAITs first
    EXPECT_TRUE(c.closed_within(2s));
  }
  {
    TorchClient c(server.port());
    c.u8(WATCH_KEY).str("/k");
    EXPECT_TRUE(c.closed_within(2s));
  }
  {
    TorchClient c(server.port());
    c.u8(SET).str("/text").str("abc");
    c.u8(ADD).str("/text").u64(1);  // not a number
    EXPECT_TRUE(c.closed_within(2s));
  }
  {
    TorchClient c(server.port());
    c.u8(SET).u64(uint64_t{1} << 40);  // a key of a terabyte
    EXPECT_TRUE(c.closed_within(2s));
  }
  TcpStore still(client_options(server.port(), 0));
  still.set("ok", std::string_view("1"));
}

TEST(TorchStoreProtocol, AJobWithATokenRefusesTorchClients) {
  auto server = torch_server("secret");
  TorchClient c(server.port());
  c.u8(ADD).str("init/").u64(1);
  EXPECT_TRUE(c.closed_within(2s));
}

TEST(TorchStoreProtocol, OffByDefault) {
  TcpStoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.handshake_timeout = 300ms;
  TcpStoreServer server(o);
  TorchClient c(server.port());
  c.u8(ADD).str("init/").u64(1);
  EXPECT_TRUE(c.closed_within(3s));
}

TEST(TorchStoreProtocol, A113SetAsTheFirstQueryIsNotTakenForValidate) {
  auto server = torch_server();
  TorchClient c(server.port());
  c.u8(SET).str("/first").str("v");  // 0, then a u64 key length: torch 1.13
  c.u8(GET).str("/first");
  EXPECT_EQ(c.read_str(), "v");
}

TEST(TorchStoreProtocol2, EveryQueryAsTorchSendsIt) {
  auto server = torch_server();
  TorchClient c = torch2_client(server.port());
  c.u8(q2::ADD).str("init/").u64(1);
  EXPECT_EQ(c.read_i64(), 1);
  c.u8(q2::SET).str("/k").str("value");  // no reply
  c.u8(q2::WAIT).u64(1).str("/k");       // torch's get: WAIT, then GET
  EXPECT_EQ(c.read_u8(), q2::STOP_WAITING);
  c.u8(q2::GET).str("/k");
  EXPECT_EQ(c.read_str(), "value");
  c.u8(q2::ADD).str("/n").u64(static_cast<uint64_t>(-5));
  EXPECT_EQ(c.read_i64(), -5);
  c.u8(q2::ADD).str("/n").u64(7);
  EXPECT_EQ(c.read_i64(), 2);
  c.u8(q2::GET).str("/n");
  EXPECT_EQ(c.read_str(), "2");  // decimal text, as torch stores counters
  c.u8(q2::CHECK).u64(2).str("/k").str("/n");
  EXPECT_EQ(c.read_u8(), 0);  // READY
  c.u8(q2::CHECK).u64(2).str("/k").str("/missing");
  EXPECT_EQ(c.read_u8(), 1);  // NOT_READY
  c.u8(q2::COMPARE_SET).str("/k").str("value").str("new");
  EXPECT_EQ(c.read_str(), "new");
  c.u8(q2::COMPARE_SET).str("/k").str("wrong").str("other");
  EXPECT_EQ(c.read_str(), "new");
  c.u8(q2::COMPARE_SET).str("/absent").str("expected").str("x");
  EXPECT_EQ(c.read_str(), "expected");  // torch's answer for a missing key
  c.u8(q2::COMPARE_SET).str("/created").str("").str("fresh");
  EXPECT_EQ(c.read_str(), "fresh");
  c.u8(q2::APPEND).str("/log").str("ab");  // creates the key; no reply
  c.u8(q2::APPEND).str("/log").str("cd");
  c.u8(q2::GET).str("/log");
  EXPECT_EQ(c.read_str(), "abcd");
  c.u8(q2::MULTI_SET).u64(3).str("/m1").str("1").str("/m2").str("").str("/m3").str("333");
  c.u8(q2::MULTI_GET).u64(3).str("/m3").str("/m1").str("/m2");
  EXPECT_EQ(c.read_str(), "333");
  EXPECT_EQ(c.read_str(), "1");
  EXPECT_EQ(c.read_str(), "");
  c.u8(q2::GETNUMKEYS);
  EXPECT_EQ(c.read_i64(), 8);  // init/, /k, /n, /created, /log, /m1, /m2, /m3
  c.u8(q2::DELETE_KEY).str("/k");
  EXPECT_EQ(c.read_i64(), 1);
  c.u8(q2::DELETE_KEY).str("/k");
  EXPECT_EQ(c.read_i64(), 0);
  c.u8(q2::GETNUMKEYS);
  EXPECT_EQ(c.read_i64(), 7);
  c.u8(q2::WAIT).u64(0);
  EXPECT_EQ(c.read_u8(), q2::STOP_WAITING);
  c.u8(q2::PING).u32(0xdeadbeef);
  EXPECT_EQ(c.read_u32(), 0xdeadbeefu);
}

TEST(TorchStoreProtocol2, AWaitIsAnsweredWhenAnotherClientSetsTheKeyLater) {
  auto server = torch_server();
  TorchClient waiter = torch2_client(server.port());
  waiter.u8(q2::WAIT).u64(2).str("/a").str("/b");
  TorchClient setter = torch2_client(server.port());
  setter.u8(q2::SET).str("/a").str("1");
  EXPECT_TRUE(waiter.silent_for(400ms)) << "answered before every key existed";
  TcpStore dtrain_client(client_options(server.port(), 0));
  dtrain_client.set("/b", std::string_view("2"));  // the last key, from dtrain's protocol
  EXPECT_EQ(waiter.read_u8(), q2::STOP_WAITING);
  waiter.u8(q2::MULTI_GET).u64(2).str("/a").str("/b");
  EXPECT_EQ(waiter.read_str(), "1");
  EXPECT_EQ(waiter.read_str(), "2");
}

TEST(TorchStoreProtocol2, ACanceledWaitIsAnsweredAndTheConnectionGoesOn) {
  auto server = torch_server();
  TorchClient c = torch2_client(server.port());
  c.u8(q2::WAIT).u64(1).str("/never");
  EXPECT_TRUE(c.silent_for(300ms));
  const auto start = std::chrono::steady_clock::now();
  c.u8(q2::CANCEL_WAIT);  // what torch's client sends when its own timeout expires
  EXPECT_EQ(c.read_u8(), q2::WAIT_CANCELED);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  // The canceled wait is gone: setting its key later sends nothing more.
  TorchClient setter = torch2_client(server.port());
  setter.u8(q2::SET).str("/never").str("now");
  EXPECT_TRUE(c.silent_for(300ms));
  c.u8(q2::PING).u32(7);
  EXPECT_EQ(c.read_u32(), 7u);
}

TEST(TorchStoreProtocol2, ACancelThatCrossesStopWaitingIsAnsweredToo) {
  auto server = torch_server();
  TorchClient c = torch2_client(server.port());
  c.u8(q2::WAIT).u64(1).str("/k");
  TorchClient setter = torch2_client(server.port());
  setter.u8(q2::SET).str("/k").str("v");
  EXPECT_EQ(c.read_u8(), q2::STOP_WAITING);
  c.u8(q2::CANCEL_WAIT);  // sent before the client read q2::STOP_WAITING: it then reads both
  EXPECT_EQ(c.read_u8(), q2::WAIT_CANCELED);
}

TEST(TorchStoreProtocol2, ABarrierIsAnsweredWhenTheLastClientArrives) {
  auto server = torch_server();
  TorchClient first = torch2_client(server.port());
  first.u8(q2::BARRIER).str("/b").u64(2);
  EXPECT_TRUE(first.silent_for(400ms)) << "answered with one of two clients there";
  TorchClient second = torch2_client(server.port());
  second.u8(q2::BARRIER).str("/b").u64(2);
  EXPECT_EQ(second.read_u8(), q2::STOP_WAITING);
  EXPECT_EQ(first.read_u8(), q2::STOP_WAITING);
  first.u8(q2::GET).str("/b");
  EXPECT_EQ(first.read_str(), "2");  // the counter, as torch leaves it
  // A barrier whose client gave up is canceled like a WAIT.
  TorchClient late = torch2_client(server.port());
  late.u8(q2::BARRIER).str("/b2").u64(5);
  EXPECT_TRUE(late.silent_for(200ms));
  late.u8(q2::CANCEL_WAIT);
  EXPECT_EQ(late.read_u8(), q2::WAIT_CANCELED);
}

TEST(TorchStoreProtocol2, ABadMagicNumberIsRefusedWithALogLine) {
  LogCapture log;
  auto server = torch_server();
  TorchClient c(server.port());
  // Nothing after the bad magic: the server closes at once, and a byte sent after that would
  // meet a reset instead of the closed connection this test looks for.
  c.u8(q2::VALIDATE).u32(0x12345678);
  EXPECT_TRUE(c.closed_within(2s));
  const std::string text = log.text();
  EXPECT_NE(text.find("0x12345678"), std::string::npos) << text;
  EXPECT_NE(text.find("VALIDATE magic 0x3c85f7ce"), std::string::npos) << text;
  EXPECT_NE(text.find("torch client 127.0.0.1:"), std::string::npos) << text;
  TcpStore still(client_options(server.port(), 0));
  still.set("ok", std::string_view("1"));
}

TEST(TorchStoreProtocol2, WhatIsNotServedClosesTheConnectionWithALogLine) {
  LogCapture log;
  auto server = torch_server();
  {
    TorchClient c = torch2_client(server.port());
    c.u8(q2::QUEUE_PUSH).str("/q").str("item");
    EXPECT_TRUE(c.closed_within(2s));
  }
  {
    TorchClient c = torch2_client(server.port());
    c.u8(q2::LIST_KEYS);
    EXPECT_TRUE(c.closed_within(2s));
  }
  {
    TorchClient c = torch2_client(server.port());
    c.u8(q2::GET).str("/never-set");  // torch's client always WAITs first
    EXPECT_TRUE(c.closed_within(2s));
  }
  {
    TorchClient c = torch2_client(server.port());
    c.u8(q2::VALIDATE).u32(q2::kMagic);  // only ever the first query
    EXPECT_TRUE(c.closed_within(2s));
  }
  {
    TorchClient c = torch2_client(server.port());
    c.u8(99);
    EXPECT_TRUE(c.closed_within(2s));
  }
  {
    TorchClient c = torch2_client(server.port());
    c.u8(q2::MULTI_SET).u64(uint64_t{1} << 40);  // a trillion pairs
    EXPECT_TRUE(c.closed_within(2s));
  }
  const std::string text = log.text();
  EXPECT_NE(text.find("QUEUE_PUSH ('/q') is not served"), std::string::npos) << text;
  EXPECT_NE(text.find("LIST_KEYS is not served"), std::string::npos) << text;
  EXPECT_NE(text.find("GET of missing key(s) \"/never-set\""), std::string::npos) << text;
  EXPECT_NE(text.find("VALIDATE after the first query"), std::string::npos) << text;
  EXPECT_NE(text.find("unknown torch 2.x store query 99"), std::string::npos) << text;
  TcpStore still(client_options(server.port(), 0));
  still.set("ok", std::string_view("1"));
}

TEST(TorchStoreProtocol2, AJobWithATokenRefusesTorch2Clients) {
  LogCapture log;
  auto server = torch_server("secret");
  TorchClient c(server.port());
  c.u8(q2::VALIDATE).u32(q2::kMagic).u8(q2::PING).u32(1);
  EXPECT_TRUE(c.closed_within(2s));
  EXPECT_NE(log.text().find("refused a torch TCPStore client"), std::string::npos) << log.text();
}

TEST(TorchStoreProtocol2, EveryProtocolSeesTheSameKeys) {
  auto server = torch_server();
  TorchClient v2 = torch2_client(server.port());
  TorchClient v1(server.port());
  TcpStore dtrain_client(client_options(server.port(), 0));
  v2.u8(q2::SET).str("/from-2").str("two");
  v1.u8(SET).str("/from-1").str("one");
  dtrain_client.set("/from-dtrain", std::string_view("dtrain"));
  // SET has no reply, so each reader WAITs first, as torch's clients do.
  v1.u8(WAIT).u64(1).str("/from-2");
  EXPECT_EQ(v1.read_u8(), 0);
  v1.u8(GET).str("/from-2");
  EXPECT_EQ(v1.read_str(), "two");
  v2.u8(q2::WAIT).u64(2).str("/from-1").str("/from-dtrain");
  EXPECT_EQ(v2.read_u8(), q2::STOP_WAITING);
  v2.u8(q2::MULTI_GET).u64(2).str("/from-1").str("/from-dtrain");
  EXPECT_EQ(v2.read_str(), "one");
  EXPECT_EQ(v2.read_str(), "dtrain");
  EXPECT_EQ(dtrain_client.get_string("/from-2"), "two");
}

}  // namespace
}  // namespace dtrain::testing
