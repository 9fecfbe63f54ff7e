// Waiting for requests: the one loop every blocking send, receive and collective step goes
// through.
//
// A waiter first busy-polls the pairs its requests need (lowest latency when the peers are
// quick), then sleeps on what their streams offer (Pair::sleep_on), moving the bytes itself on
// every wake-up: in poll() on the sockets when every pair is TCP; on the futex bells the peers
// ring when every pair (or the one pair all unfinished requests wait on) is shared memory; and
// otherwise, or where the kernel cannot wait on several futexes (before Linux 5.16), on the
// requests themselves while the device's event loop moves the bytes.
#pragma once

#include <span>

#include "common/deadline.h"
#include "transport/pair.h"
#include "transport/request.h"

namespace dtrain::transport {

// Waits until every request has finished, moving the bytes of `pairs` (those whose progress the
// requests need; every request's pair among them). At the deadline the unfinished requests are
// cancelled. Rethrows the first error, in request order.
// `spinning`: the caller already holds the pairs in spin mode (begin_spin) for longer than
// this wait, as a collective does for its whole run.
void wait_requests(std::span<Request* const> requests, std::span<Pair* const> pairs,
                   const Deadline& deadline, bool spinning = false);
// One request on its own pair (a blocking send or receive).
void wait_request(Request& request, const Deadline& deadline);

}  // namespace dtrain::transport
