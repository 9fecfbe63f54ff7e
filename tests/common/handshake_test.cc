// The connection handshake between two real sockets: matching jobs, other jobs, tokens, garbage.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <thread>

#include "common/handshake.h"
#include "common/socket.h"
#include "dtrain/error.h"

namespace dtrain::net {
namespace {

using namespace std::chrono_literals;

struct Outcome {
  bool accepted = false;
  std::string server_error;
  std::string client_error;
  Hello hello;
};

Outcome run(const HandshakeConfig& server, const HandshakeConfig& client, Role role = Role::kPair) {
  Fd listener = listen_tcp("127.0.0.1", 0);
  uint16_t port = local_port(listener.get());
  Outcome out;
  std::thread srv([&] {
    Fd fd = accept_tcp(listener.get(), Deadline::after(5s), "test accept");
    try {
      out.hello = handshake_accept(fd.get(), server, Role::kPair, 0, Deadline::after(5s));
      out.accepted = true;
    } catch (const HandshakeRefused& r) {
      out.server_error = r.reason;
    }
  });
  try {
    Fd fd = connect_tcp({"127.0.0.1", port}, Deadline::after(5s), "test client");
    handshake_connect(fd.get(), client, Hello{role, 3, 0, 42}, 0, Deadline::after(5s), "test client");
  } catch (const Error& e) {
    out.client_error = e.what();
  }
  srv.join();
  return out;
}

TEST(Handshake, SameJobIsAccepted) {
  auto o = run({"job", ""}, {"job", ""});
  EXPECT_TRUE(o.accepted) << o.server_error << o.client_error;
  EXPECT_EQ(o.hello.rank, 3);
  EXPECT_EQ(o.hello.tag, 42u);
}

TEST(Handshake, OtherJobIsRefusedWithReason) {
  auto o = run({"job-a", ""}, {"job-b", ""});
  EXPECT_FALSE(o.accepted);
  EXPECT_NE(o.server_error.find("job-b"), std::string::npos) << o.server_error;
  EXPECT_NE(o.client_error.find("DTRAIN_JOB_ID"), std::string::npos) << o.client_error;
}

TEST(Handshake, WrongRoleIsRefused) {
  auto o = run({"job", ""}, {"job", ""}, Role::kStoreClient);
  EXPECT_FALSE(o.accepted);
  EXPECT_NE(o.client_error.find("store client"), std::string::npos) << o.client_error;
}

TEST(Handshake, TokenMustMatch) {
  EXPECT_TRUE(run({"job", "tok"}, {"job", "tok"}).accepted);
  auto wrong = run({"job", "tok"}, {"job", "other"});
  EXPECT_FALSE(wrong.accepted);
  EXPECT_NE(wrong.client_error.find("token"), std::string::npos) << wrong.client_error;
  auto missing = run({"job", "tok"}, {"job", ""});
  EXPECT_FALSE(missing.accepted);
  EXPECT_NE(missing.client_error.find("DTRAIN_AUTH_TOKEN"), std::string::npos) << missing.client_error;
  // A client with a token refuses a server that cannot prove it knows one.
  auto unauth_server = run({"job", ""}, {"job", "tok"});
  EXPECT_NE(unauth_server.client_error.find("does not authenticate"), std::string::npos)
      << unauth_server.client_error;
}

TEST(Handshake, GarbageIsRefused) {
  Fd listener = listen_tcp("127.0.0.1", 0);
  uint16_t port = local_port(listener.get());
  std::string reason;
  std::thread srv([&] {
    Fd fd = accept_tcp(listener.get(), Deadline::after(5s), "test accept");
    try {
      handshake_accept(fd.get(), {"job", ""}, Role::kPair, 0, Deadline::after(5s));
    } catch (const HandshakeRefused& r) {
      reason = r.reason;
    }
  });
  Fd fd = connect_tcp({"127.0.0.1", port}, Deadline::after(5s), "garbage client");
  std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n and more bytes to fill a hello";
  write_all(fd.get(), junk.data(), junk.size(), Deadline::after(5s), "garbage");
  srv.join();
  EXPECT_NE(reason.find("not a dtrain hello"), std::string::npos) << reason;
}

}  // namespace
}  // namespace dtrain::net
