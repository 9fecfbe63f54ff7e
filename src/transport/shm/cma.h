// Cross-memory attach: copying straight between this process's memory and a peer's on the same
// host (process_vm_readv/writev), one copy instead of the ring's two. The kernel allows it for
// the same user under the host's ptrace policy; Segment::probe_peer records whether it does.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace dtrain::transport::shm {

enum class CmaDirection { kRead, kWrite };

// Copies `size` bytes between `local` and `address` in process `pid` (kRead: into local);
// false with errno set when the kernel refuses or the peer is gone.
bool cma_copy(pid_t pid, std::byte* local, uint64_t address, size_t size, CmaDirection direction);

}  // namespace dtrain::transport::shm
