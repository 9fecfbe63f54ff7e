// torch's TCPStore protocol (PyTorch 1.13), served by dtrain's store server beside its own.
//
// Under `dtrain run` the launcher hosts the job's store on MASTER_PORT and sets
// TORCHELASTIC_USE_AGENT_STORE=True, as torchrun does: a PyTorch script's init_process_group then
// connects to that store as a client instead of hosting a TCPStore of its own on the same port.
// torch's client says nothing to identify itself; its first byte is a query type (0-8), which no
// dtrain handshake starts with ('D'), so the server tells the two apart from the first byte.
//
//   request   u8 query | fields         string/bytes: u64 length | bytes; key list: u64 count |
//   keys SET 0         key, value            no reply COMPARE_SET 1 key, expected, desired  bytes
//   (torch's rules: expected, when the key is missing) GET 2         key                   bytes
//   (the client WAITs first; a missing key ends the link) ADD 3         key, i64 delta        i64;
//   stored as decimal text, as dtrain's add stores it CHECK 4       keys                  u8 0
//   ready / 1 not ready WAIT 5        keys                  u8 0 once every key exists (the client
//   times out itself) GETNUMKEYS 6  -                     i64 WATCH_KEY 7   key not served: the
//   connection is closed, with a log line DELETE_KEY 8  key                   i64 1 or 0
//
// Integers are little-endian. Each client opens a second connection for watch_key callbacks
// that stays silent; the server holds it open (see TcpStoreServerOptions::torch_clients).
// torch's protocol has no authentication: with a job token set, torch clients are refused.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "store/store_protocol.h"

namespace dtrain::store {

// Whether a connection's first byte is one of torch's query types.
inline bool is_torch_query(uint8_t first_byte) { return first_byte <= 8; }

struct TorchClientHooks {
  // Runs one request against the store's map (TcpStoreServer::Impl::handle).
  std::function<Response(const Request&)> handle;
};

// Serves one torch client on `fd` until it hangs up, sends something malformed, or the server
// stops (handle answers kError). Throws on a broken connection or a protocol error.
void serve_torch_client(int fd, const TorchClientHooks& hooks, std::string_view context);

}  // namespace dtrain::store
