// The store server speaking torch's TCPStore protocol (torch 1.13) beside its own, over real
// sockets: the byte layouts torch's client sends and expects, a WAIT answered when another client
// (a dtrain one, even) sets the key, the silent second connection torch opens, and what is
// refused. The end-to-end check, torch's own client under `dtrain run`, is tests/python.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <thread>

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

enum Q : uint8_t { SET = 0, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, WATCH_KEY, DELETE_KEY };

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

}  // namespace
}  // namespace dtrain::testing
