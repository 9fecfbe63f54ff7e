// torch's TCPStore protocols, served by dtrain's store server beside its own: torch 2.x's (as
// torch 2.15 numbers its queries; torch appends each new query at the end, so 2.11 through 2.15
// agree) and torch 1.13's.
//
// Under `dtrain run` the launcher hosts the job's store on MASTER_PORT and sets
// TORCHELASTIC_USE_AGENT_STORE=True, as torchrun does: a PyTorch script's init_process_group then
// connects to that store as a client instead of hosting a TCPStore of its own on the same port.
// torch's client says nothing to identify itself, so the server tells the three protocols apart
// from the first bytes of a connection:
//
// clang-format off
//   'D' ...                    dtrain's own handshake
//   0, u32 0x3C85F7CE          torch 2.x: VALIDATE and its magic (a 2.x client always opens so)
//   0, u64 length <= 64 KiB    torch 1.13: SET, with the length of its key
//   1 .. 8                     torch 1.13: any other query (its client opens with ADD or WAIT)
// clang-format on
//
// A 1.13 SET cannot pass for VALIDATE: its key would be at least 0x3C85F7CE bytes (968 MiB),
// far over kMaxKeyBytes. A connection that opens with 0 followed by neither is refused, with a
// log line that shows the magic expected and the bytes received.
//
// Strings and bytes are u64 length | bytes, a key list is u64 count | keys, integers are
// little-endian; a request is u8 query | fields. No query has a reply unless one is listed.
//
// clang-format off
// torch 2.x (QueryType in torch/csrc/distributed/c10d/store/TCPStoreBackend.hpp):
//   VALIDATE     0   u32 magic              (first query only)
//   SET          1   key, value
//   COMPARE_SET  2   key, expected, desired -> bytes (torch's rule: `expected` for a missing key)
//   GET          3   key                    -> bytes (the client WAITs first: a missing key ends
//                                              the connection, as in torch)
//   ADD          4   key, i64 delta         -> i64; stored as decimal text, as dtrain's add does
//   CHECK        5   keys                   -> u8 0 all present / 1 not
//   WAIT         6   keys                   -> u8 0 STOP_WAITING once every key exists; the
//                                              client times out itself and sends CANCEL_WAIT
//   GETNUMKEYS   7                          -> i64
//   DELETE_KEY   8   key                    -> i64 1 deleted / 0 missing
//   APPEND       9   key, bytes             (creates the key when missing)
//   MULTI_GET   10   keys                   -> one bytes per key (the client WAITs first)
//   MULTI_SET   11   u64 count, count * (key, value)
//   CANCEL_WAIT 12                          -> u8 1 WAIT_CANCELED; ends a pending WAIT, whose
//                                              STOP_WAITING may come first when the keys won
//   PING        13   u32 nonce              -> u32 nonce
//   QUEUE_PUSH  14, QUEUE_POP 15, QUEUE_LEN 16, LIST_KEYS 17: not served (torch's queues live
//                    beside its map, and dtrain's store has neither queues nor a key listing):
//                    the connection is closed, with a log line naming the query and the key
//   BARRIER     18   key, i64 world size    -> u8 0 once the key's counter, which this query
//                                              adds 1 to, reaches the world size; canceled
//                                              like WAIT
//
// torch 1.13:
//   SET 0, COMPARE_SET 1, GET 2, ADD 3, CHECK 4, WAIT 5, GETNUMKEYS 6, DELETE_KEY 8: as in 2.x
//   (1.13's WAIT has no cancel: its client gives up by closing the connection).
//   WATCH_KEY    7   key                    not served: the connection is closed, with a log line
// clang-format on
//
// A torch 2.x client learns nothing of the server's version: it opens with VALIDATE (never
// answered) and PING, and a server that does not know a query closes the connection. A 1.13
// client also opens a second connection, for watch_key callbacks, that stays silent; the server
// holds it open (see TcpStoreServerOptions::torch_clients). 2.x opens no second connection.
// torch's protocols have no authentication: with a job token set, torch clients are refused.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "store/store_protocol.h"

namespace dtrain::store {

// torch 2.x's VALIDATE magic number (TCPStoreBackend.hpp's validationMagicNumber).
inline constexpr uint32_t kTorchValidateMagic = 0x3C85F7CE;

// Whether a connection's first byte can start one of torch's protocols (2.x's VALIDATE is 0).
inline bool is_torch_query(uint8_t first_byte) { return first_byte <= 8; }

struct TorchClientHooks {
  // Runs one request against the store's map (TcpStoreServer::Impl::handle).
  std::function<Response(const Request&)> handle;
  // Appends `suffix` to the key's value, creating the key when missing, and wakes its waiters
  // (torch 2.x's APPEND). kInvalid when the value would grow over kMaxValueBytes.
  std::function<Response(const std::string& key, const Bytes& suffix)> append;
  // Waits up to `timeout` for the integer at `key` to reach `at_least` (torch 2.x's BARRIER):
  // kOk, kTimeout, kInvalid for a value that is not an integer, kError when the server stops.
  std::function<Response(const std::string& key, int64_t at_least,
                         std::chrono::milliseconds timeout)>
      wait_for_count;
};

// Serves one torch client, of either protocol, on `fd` until it hangs up, sends something
// malformed, or the server stops (handle answers kError). Throws on a broken connection or a
// protocol error (an unknown opening, an unknown query).
void serve_torch_client(int fd, const TorchClientHooks& hooks, std::string_view context);

}  // namespace dtrain::store
