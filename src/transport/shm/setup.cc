#include "transport/shm/setup.h"

#include <cstdint>

#include <fmt/format.h>

#include "common/log.h"
#include "dtrain/error.h"

namespace dtrain::transport::shm {

std::vector<Segment> share_memory(const SetupOptions& options, const std::vector<bool>& local,
                                  std::vector<net::Fd>& fds, const Deadline& deadline) {
  const int rank = options.rank, size = options.size;
  std::vector<Segment> segments(size);
  auto context = [&](int peer) {
    return fmt::format("rank {}: setting up shared memory with rank {}", rank, peer);
  };
  auto failed = [&](int peer, const std::string& why) {
    if (options.required)
      throw PeerFailureError(
          fmt::format("{}: {} (DTRAIN_TRANSPORT=shm requires it; use auto to "
                      "fall back to TCP)",
                      context(peer), why));
    DTRAIN_LOG_DEBUG("{}: {}; using TCP", context(peer), why);
  };
  for (int peer = rank + 1; peer < size; ++peer) {
    if (!local[peer]) continue;
    std::string name;
    try {
      segments[peer] =
          Segment::create(segment_name(options.job_id, options.group_name, rank, peer));
      name = segments[peer].name();
    } catch (const Error& e) {
      failed(peer, e.what());
    }
    uint16_t len = static_cast<uint16_t>(name.size());
    net::write_all(fds[peer].get(), &len, sizeof(len), deadline, context(peer));
    net::write_all(fds[peer].get(), name.data(), name.size(), deadline, context(peer));
  }
  for (int peer = 0; peer < rank; ++peer) {
    if (!local[peer]) continue;
    uint16_t len = 0;
    net::read_all(fds[peer].get(), &len, sizeof(len), deadline, context(peer));
    std::string name(len, '\0');
    net::read_all(fds[peer].get(), name.data(), len, deadline, context(peer));
    uint8_t ok = 0;
    if (len > 0) {
      try {
        segments[peer] = Segment::open(name);
        segments[peer].probe_peer(/*creator=*/false);
        ok = 1;
      } catch (const Error& e) {
        failed(peer, e.what());
      }
    }
    net::write_all(fds[peer].get(), &ok, 1, deadline, context(peer));
  }
  for (int peer = rank + 1; peer < size; ++peer) {
    if (!local[peer]) continue;
    uint8_t ok = 0;
    net::read_all(fds[peer].get(), &ok, 1, deadline, context(peer));
    if (!segments[peer].valid()) continue;
    segments[peer].unlink();  // both have it mapped: nothing may outlive the two processes
    if (!ok) {
      segments[peer] = Segment();
      failed(peer, "the peer could not open the segment");
      continue;
    }
    segments[peer].probe_peer(/*creator=*/true);
  }
  return segments;
}

}  // namespace dtrain::transport::shm
