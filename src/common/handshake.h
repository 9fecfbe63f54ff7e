// The handshake every dtrain connection opens with (store and data alike):
//   client -> server  Hello   magic, version, role, job id, ranks, tag, client nonce
//   server -> client  Reply   magic, version, accept/reject + reason, server rank, server nonce
//   client -> server  Proof   HMAC(token, client|nonces|job)                 (only with a token)
//   server -> client  Verdict accept/reject + reason, and on accept HMAC(token, server|nonces|job)
// The client proves it knows the token first: the server answers nothing derived from the token
// until then, so connecting gives an attacker nothing to guess the token against offline (the
// server's proof, checked by the client, keeps the client from talking to an impostor).
// Random bytes, another job, another protocol version or a wrong token are refused with a
// reason the refused side can print; the listening side logs it and keeps serving.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/deadline.h"

namespace dtrain::net {

inline constexpr uint32_t kMagic = 0x4e525444;   // "DTRN" on the wire
inline constexpr uint16_t kProtocolVersion = 2;  // 2: the server proves itself last

enum class Role : uint8_t { kStoreClient = 1, kPair = 2, kPsClient = 3 };

struct HandshakeConfig {
  std::string job_id;  // must match exactly on both sides
  std::string token;   // empty = no authentication
  // Reads DTRAIN_JOB_ID and DTRAIN_AUTH_TOKEN.
  static HandshakeConfig from_env();
};

struct Hello {
  Role role = Role::kStoreClient;
  int32_t rank = -1;       // the connecting side's rank (-1 when not a rank, e.g. a tool)
  int32_t peer_rank = -1;  // the rank it expects to reach
  uint64_t tag = 0;        // what the connection is for (a process group id for pairs)
};

// Thrown on the listening side when a connection is refused; the caller logs and drops it.
struct HandshakeRefused {
  std::string reason;
};

// Client side: sends `mine`, checks the server's identity; returns the server's rank.
// Throws StoreError/PeerFailureError (refused, with the server's reason) or TimeoutError.
int32_t handshake_connect(int fd, const HandshakeConfig& config, const Hello& mine,
                          int32_t my_server_rank_expectation, const Deadline& deadline,
                          std::string_view context);

// Server side: reads and checks the client's Hello; `server_rank` is sent back.
// Throws HandshakeRefused (after telling the client why, when it spoke our protocol).
Hello handshake_accept(int fd, const HandshakeConfig& config, Role expected_role,
                       int32_t server_rank, const Deadline& deadline);

}  // namespace dtrain::net
