#include "common/handshake.h"

#include <sys/random.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "common/byte_order.h"
#include "common/env.h"
#include "common/socket.h"
#include "dtrain/error.h"

namespace dtrain::net {
namespace {

constexpr size_t kNonceBytes = 16;
constexpr size_t kMacBytes = 32;
constexpr size_t kMaxJobId = 256;
constexpr size_t kMaxReason = 1024;

using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

// On the wire as they are: little-endian fields (byte_order.h), no padding.
struct HelloWire {
  Le<uint32_t> magic;
  Le<uint16_t> version;
  uint8_t role;
  uint8_t has_token;
  Le<int32_t> rank;
  Le<int32_t> peer_rank;
  Le<uint64_t> tag;
  Le<uint16_t> job_id_len;
  uint8_t nonce[kNonceBytes];
};
struct ReplyWire {
  Le<uint32_t> magic;
  Le<uint16_t> version;
  uint8_t accepted;
  uint8_t auth_required;
  Le<int32_t> rank;
  uint8_t nonce[kNonceBytes];
  Le<uint16_t> reason_len;
};
struct VerdictWire {
  uint8_t accepted;
  uint8_t mac[kMacBytes];  // the server's proof, on accept only
  Le<uint16_t> reason_len;
};
static_assert(sizeof(HelloWire) == 42 && sizeof(ReplyWire) == 30 && sizeof(VerdictWire) == 35);

// From the kernel (getrandom), not OpenSSL's generator: a process forked while another of its
// threads was inside RAND_bytes inherits that generator's lock held, and its first handshake
// would wait on it forever (seen with the forked ranks of the tests, and a fork-based data
// loader would do the same).
Nonce random_nonce() {
  Nonce n{};
  size_t got = 0;
  while (got < n.size()) {
    ssize_t r = ::getrandom(n.data() + got, n.size() - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      throw InternalError(
          fmt::format("getrandom failed to produce a handshake nonce: {}", std::strerror(errno)));
    got += static_cast<size_t>(r);
  }
  return n;
}

Mac compute_mac(const std::string& token, std::string_view label, const uint8_t* first,
                const uint8_t* second, const std::string& job_id) {
  std::vector<uint8_t> msg;
  msg.insert(msg.end(), label.begin(), label.end());
  msg.insert(msg.end(), first, first + kNonceBytes);
  msg.insert(msg.end(), second, second + kNonceBytes);
  msg.insert(msg.end(), job_id.begin(), job_id.end());
  Mac mac{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), msg.data(), msg.size(),
       mac.data(), &len);
  return mac;
}

bool mac_equal(const uint8_t* a, const uint8_t* b) { return CRYPTO_memcmp(a, b, kMacBytes) == 0; }

std::string read_string(int fd, size_t len, const Deadline& deadline, std::string_view context) {
  std::string s(len, '\0');
  read_all(fd, s.data(), len, deadline, context);
  return s;
}

void send_reply(int fd, bool accepted, bool auth, int32_t rank, const Nonce& nonce,
                std::string_view reason, const Deadline& deadline) {
  ReplyWire r{};
  r.magic = kMagic;
  r.version = kProtocolVersion;
  r.accepted = accepted ? 1 : 0;
  r.auth_required = auth ? 1 : 0;
  r.rank = rank;
  std::memcpy(r.nonce, nonce.data(), kNonceBytes);
  reason = reason.substr(0, kMaxReason);
  r.reason_len = static_cast<uint16_t>(reason.size());
  std::string buf(reinterpret_cast<const char*>(&r), sizeof(r));
  buf.append(reason);
  write_all(fd, buf.data(), buf.size(), deadline, "handshake reply");
}

void send_verdict(int fd, bool accepted, const Mac& mac, std::string_view reason,
                  const Deadline& deadline) {
  VerdictWire v{};
  v.accepted = accepted ? 1 : 0;
  std::memcpy(v.mac, mac.data(), kMacBytes);
  reason = reason.substr(0, kMaxReason);
  v.reason_len = static_cast<uint16_t>(reason.size());
  std::string buf(reinterpret_cast<const char*>(&v), sizeof(v));
  buf.append(reason);
  write_all(fd, buf.data(), buf.size(), deadline, "handshake verdict");
}

std::string_view role_name(uint8_t role) {
  switch (role) {
    case static_cast<uint8_t>(Role::kStoreClient):
      return "store client";
    case static_cast<uint8_t>(Role::kPair):
      return "rank-to-rank connection";
    case static_cast<uint8_t>(Role::kPsClient):
      return "parameter-server worker";
  }
  return "unknown role";
}

}  // namespace

HandshakeConfig HandshakeConfig::from_env() {
  return HandshakeConfig{env::get_string(env::kJobId), env::get_string(env::kAuthToken)};
}

int32_t handshake_connect(int fd, const HandshakeConfig& config, const Hello& mine,
                          int32_t expected_server_rank, const Deadline& deadline,
                          std::string_view context) {
  if (config.job_id.size() > kMaxJobId)
    throw InvalidArgumentError(fmt::format("job id is {} bytes long; at most {} are allowed",
                                           config.job_id.size(), kMaxJobId));
  Nonce client_nonce = random_nonce();
  HelloWire h{};
  h.magic = kMagic;
  h.version = kProtocolVersion;
  h.role = static_cast<uint8_t>(mine.role);
  h.has_token = config.token.empty() ? 0 : 1;
  h.rank = mine.rank;
  h.peer_rank = mine.peer_rank;
  h.tag = mine.tag;
  h.job_id_len = static_cast<uint16_t>(config.job_id.size());
  std::memcpy(h.nonce, client_nonce.data(), kNonceBytes);
  std::string buf(reinterpret_cast<const char*>(&h), sizeof(h));
  buf.append(config.job_id);
  std::string ctx = fmt::format("{} (handshake)", context);
  write_all(fd, buf.data(), buf.size(), deadline, ctx);

  ReplyWire r{};
  read_all(fd, &r, sizeof(r), deadline, ctx);
  if (r.magic != kMagic)
    throw PeerFailureError(fmt::format(
        "{}: the other side is not a dtrain endpoint (magic 0x{:08x}); check the address and port",
        ctx, r.magic));
  std::string reason = read_string(fd, std::min<size_t>(r.reason_len, kMaxReason), deadline, ctx);
  if (!r.accepted)
    throw PeerFailureError(fmt::format("{}: refused by the other side: {}", ctx, reason));
  if (r.version != kProtocolVersion)
    throw PeerFailureError(fmt::format("{}: the other side speaks protocol version {}, we speak {}",
                                       ctx, r.version, kProtocolVersion));
  if (expected_server_rank >= 0 && r.rank != expected_server_rank)
    throw PeerFailureError(fmt::format("{}: expected rank {} there but found rank {}", ctx,
                                       expected_server_rank, r.rank));
  if (r.auth_required && config.token.empty())
    throw PeerFailureError(fmt::format(
        "{}: the other side requires authentication: set DTRAIN_AUTH_TOKEN to the job's token",
        ctx));
  if (!r.auth_required && !config.token.empty())
    throw PeerFailureError(fmt::format(
        "{}: DTRAIN_AUTH_TOKEN is set but the other side does not authenticate; refusing to talk "
        "to an endpoint that cannot prove it knows the token",
        ctx));
  if (!config.token.empty()) {
    Mac proof =
        compute_mac(config.token, "dtrain-client", r.nonce, client_nonce.data(), config.job_id);
    write_all(fd, proof.data(), proof.size(), deadline, ctx);
    VerdictWire v{};
    read_all(fd, &v, sizeof(v), deadline, ctx);
    std::string why = read_string(fd, std::min<size_t>(v.reason_len, kMaxReason), deadline, ctx);
    if (!v.accepted) throw PeerFailureError(fmt::format("{}: refused: {}", ctx, why));
    Mac expected =
        compute_mac(config.token, "dtrain-server", client_nonce.data(), r.nonce, config.job_id);
    if (!mac_equal(expected.data(), v.mac))
      throw PeerFailureError(fmt::format(
          "{}: the other side does not know DTRAIN_AUTH_TOKEN (bad proof); check the token", ctx));
  }
  return r.rank;
}

Hello handshake_accept(int fd, const HandshakeConfig& config, Role expected_role,
                       int32_t server_rank, const Deadline& deadline) {
  const std::string from = peer_name(fd);
  HelloWire h{};
  try {
    read_all(fd, &h, sizeof(h), deadline, "handshake");
  } catch (const Error& e) {
    throw HandshakeRefused{fmt::format("{} sent no complete hello: {}", from, e.what())};
  }
  if (h.magic != kMagic)
    throw HandshakeRefused{
        fmt::format("{} sent bytes that are not a dtrain hello (magic 0x{:08x}, expected 0x{:08x})",
                    from, h.magic, kMagic)};
  const bool auth = !config.token.empty();
  Nonce server_nonce = random_nonce();
  auto refuse = [&](std::string reason) -> HandshakeRefused {
    try {
      send_reply(fd, false, auth, server_rank, server_nonce, reason, deadline);
    } catch (const Error&) {
      // The client may already be gone; the refusal is logged either way.
    }
    return HandshakeRefused{fmt::format("{}: {}", from, reason)};
  };
  if (h.version != kProtocolVersion)
    throw refuse(
        fmt::format("protocol version {} is not ours ({}); run the same dtrain version "
                    "everywhere",
                    h.version, kProtocolVersion));
  if (h.job_id_len > kMaxJobId)
    throw refuse(fmt::format("job id length {} exceeds {}", h.job_id_len, kMaxJobId));
  std::string job_id;
  try {
    job_id = read_string(fd, h.job_id_len, deadline, "handshake job id");
  } catch (const Error& e) {
    throw HandshakeRefused{fmt::format("{}: incomplete hello: {}", from, e.what())};
  }
  if (job_id != config.job_id)
    throw refuse(fmt::format("job id '{}' is not this job's ('{}'); check DTRAIN_JOB_ID", job_id,
                             config.job_id));
  if (h.role != static_cast<uint8_t>(expected_role))
    throw refuse(fmt::format("a {} connected where a {} was expected", role_name(h.role),
                             role_name(static_cast<uint8_t>(expected_role))));
  if (auth && !h.has_token)
    throw refuse("authentication required: set DTRAIN_AUTH_TOKEN to the job's token");

  send_reply(fd, true, auth, server_rank, server_nonce, "", deadline);
  if (auth) {
    Mac proof{};
    try {
      read_all(fd, proof.data(), proof.size(), deadline, "handshake proof");
    } catch (const Error& e) {
      throw HandshakeRefused{fmt::format("{}: gave no token proof: {}", from, e.what())};
    }
    Mac expected =
        compute_mac(config.token, "dtrain-client", server_nonce.data(), h.nonce, config.job_id);
    if (!mac_equal(expected.data(), proof.data())) {
      try {
        send_verdict(fd, false, Mac{},
                     "wrong DTRAIN_AUTH_TOKEN: this process's token is not the job's; check the "
                     "token where each process is started",
                     deadline);
      } catch (const Error&) {
      }
      throw HandshakeRefused{fmt::format("{}: wrong auth token", from)};
    }
    // Only now, to a client that proved it knows the token, the server's own proof.
    send_verdict(
        fd, true,
        compute_mac(config.token, "dtrain-server", h.nonce, server_nonce.data(), config.job_id), "",
        deadline);
  }
  return Hello{static_cast<Role>(h.role), h.rank, h.peer_rank, h.tag};
}

}  // namespace dtrain::net
