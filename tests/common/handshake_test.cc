// The connection handshake between two real sockets: matching jobs, other jobs, tokens, garbage.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <thread>
#include <vector>

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

// The listening side on a thread of its own: accepts one connection, runs handshake_accept with
// `config` and keeps the refusal's reason, for tests that play the client byte by byte.
class ListeningSide {
 public:
  explicit ListeningSide(HandshakeConfig config) : listener_(listen_tcp("127.0.0.1", 0)) {
    thread_ = std::thread([this, config] {
      Fd fd = accept_tcp(listener_.get(), Deadline::after(5s), "test accept");
      try {
        handshake_accept(fd.get(), config, Role::kPair, 0, Deadline::after(5s));
      } catch (const HandshakeRefused& r) {
        reason_ = r.reason;
      }
    });
  }
  ~ListeningSide() {
    if (thread_.joinable()) thread_.join();
  }
  uint16_t port() const { return local_port(listener_.get()); }
  // Waits for the handshake to end.
  std::string reason() {
    thread_.join();
    return reason_;
  }

 private:
  Fd listener_;
  std::string reason_;
  std::thread thread_;
};

TEST(Handshake, GarbageIsRefused) {
  ListeningSide server({"job", ""});
  Fd fd = connect_tcp({"127.0.0.1", server.port()}, Deadline::after(5s), "garbage client");
  std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n and more bytes to fill a hello";
  write_all(fd.get(), junk.data(), junk.size(), Deadline::after(5s), "garbage");
  const std::string reason = server.reason();
  EXPECT_NE(reason.find("not a dtrain hello"), std::string::npos) << reason;
}

// The server proves it knows the token only to a client that proved it first: a client that
// does not know the token receives nothing computed from it (before, the reply carried the
// server's HMAC of a nonce the client chose, and a short token fell to an offline search).
TEST(Handshake, AClientWithoutTheTokenLearnsNothingDerivedFromIt) {
  ListeningSide server({"job", "secret"});
  Fd fd = connect_tcp({"127.0.0.1", server.port()}, Deadline::after(5s), "guessing client");
  // A hello as handshake.cc lays it out (packed), claiming to have a token; then the job id.
  std::vector<uint8_t> hello;
  auto put = [&](const void* p, size_t n) {
    auto* b = static_cast<const uint8_t*>(p);
    hello.insert(hello.end(), b, b + n);
  };
  uint32_t magic = kMagic;
  uint16_t version = kProtocolVersion, job_len = 3;
  uint8_t role = static_cast<uint8_t>(Role::kPair), has_token = 1;
  int32_t rank = 1, peer_rank = 0;
  uint64_t tag = 0;
  uint8_t nonce[16] = {1, 2, 3};
  put(&magic, 4), put(&version, 2), put(&role, 1), put(&has_token, 1), put(&rank, 4);
  put(&peer_rank, 4), put(&tag, 8), put(&job_len, 2), put(nonce, 16), put("job", 3);
  write_all(fd.get(), hello.data(), hello.size(), Deadline::after(5s), "guess");
  // The reply is exactly magic, version, accepted, auth, rank, nonce and an empty reason: 30
  // bytes, no MAC in it.
  uint8_t reply[30];
  read_all(fd.get(), reply, sizeof(reply), Deadline::after(5s), "guess");
  EXPECT_EQ(reply[6], 1) << "accepted so far";
  EXPECT_EQ(reply[7], 1) << "authentication required";
  EXPECT_EQ(reply[28] | reply[29], 0) << "no reason text after an acceptance";
  // A guessed proof: refused, and the verdict's MAC field is all zeros.
  std::vector<uint8_t> proof(32, 0x5a);
  write_all(fd.get(), proof.data(), proof.size(), Deadline::after(5s), "guess");
  uint8_t verdict[35];
  read_all(fd.get(), verdict, sizeof(verdict), Deadline::after(5s), "guess");
  EXPECT_EQ(verdict[0], 0) << "a guessed proof was accepted";
  for (int i = 1; i < 33; ++i) EXPECT_EQ(verdict[i], 0) << "byte " << i << " of the verdict's MAC";
  const std::string reason = server.reason();
  EXPECT_NE(reason.find("wrong auth token"), std::string::npos) << reason;
}

}  // namespace
}  // namespace dtrain::net
