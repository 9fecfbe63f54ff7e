// Setting up shared memory with the peers on this host, over the TCP connections just made to
// them: the lower rank of each pair creates and names a segment, the higher opens it and
// answers, then the lower reads the answers (three phases, so no two ranks wait on each other).
#pragma once

#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/socket.h"
#include "transport/shm/segment.h"

namespace dtrain::transport::shm {

struct SetupOptions {
  int rank = 0;
  int size = 1;
  std::string job_id;  // the segments' names carry it (segment_name)
  std::string group_name;
  // Fail (PeerFailureError) when a peer's segment cannot be set up, instead of leaving that
  // pair on TCP (DTRAIN_TRANSPORT=shm).
  bool required = false;
};

// A segment for every peer marked `local` (others, and those that failed, stay invalid);
// `fds[peer]` is the connection to each peer, read and written within `deadline`.
std::vector<Segment> share_memory(const SetupOptions& options, const std::vector<bool>& local,
                                  std::vector<net::Fd>& fds, const Deadline& deadline);

}  // namespace dtrain::transport::shm
