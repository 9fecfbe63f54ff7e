// net:: socket options on real connections: congestion control over loopback, and telling a peer
// on this host from one elsewhere.
#include <gtest/gtest.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <string>
#include <thread>

#include "common/socket.h"
#include "support/addresses.h"

namespace dtrain::net {
namespace {

using namespace std::chrono_literals;

struct Connection {
  Fd client, server;
};

Connection connect_over(const std::string& host) {
  Fd listener = listen_tcp(host, 0);
  const uint16_t port = local_port(listener.get());
  Connection c;
  std::thread accepting([&] { c.server = accept_tcp(listener.get(), Deadline::after(5s), "test accept"); });
  c.client = connect_tcp({host, port}, Deadline::after(5s), "test connect");
  accepting.join();
  return c;
}

std::string congestion_control(int fd) {
  char name[32] = {};
  socklen_t len = sizeof(name);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "?";
  return std::string(name, strnlen(name, len));
}

TEST(Socket, LoopbackConnectionsUseReno) {
  Connection c = connect_over("127.0.0.1");
  EXPECT_TRUE(peer_is_on_this_host(c.client.get()));
  EXPECT_TRUE(peer_is_on_this_host(c.server.get()));
  ASSERT_TRUE(use_loopback_congestion_control(c.client.get()));
  ASSERT_TRUE(use_loopback_congestion_control(c.server.get()));
  EXPECT_EQ(congestion_control(c.client.get()), "reno");
  EXPECT_EQ(congestion_control(c.server.get()), "reno");
  // Data still flows after the switch.
  const char out[] = "after";
  write_all(c.client.get(), out, sizeof(out), Deadline::after(5s), "test write");
  char in[sizeof(out)] = {};
  read_all(c.server.get(), in, sizeof(in), Deadline::after(5s), "test read");
  EXPECT_STREQ(in, out);
}

TEST(Socket, ThisHostsOwnAddressIsThisHost) {
  const std::string address = testing::non_loopback_ipv4();
  if (address.empty()) GTEST_SKIP() << "this host has no IPv4 address besides loopback";
  Connection c = connect_over(address);
  EXPECT_TRUE(peer_is_on_this_host(c.client.get())) << address;
  EXPECT_TRUE(peer_is_on_this_host(c.server.get())) << address;
}

TEST(Socket, AnUnconnectedSocketHasNoPeerOnThisHost) {
  Fd fd(::socket(AF_INET, SOCK_STREAM, 0));
  ASSERT_TRUE(fd.valid());
  EXPECT_FALSE(peer_is_on_this_host(fd.get()));
}

}  // namespace
}  // namespace dtrain::net
