#include "transport/shm/cma.h"

#include <sys/uio.h>

#include <cerrno>

namespace dtrain::transport::shm {

bool cma_copy(pid_t pid, std::byte* local_data, uint64_t address, size_t size,
              CmaDirection direction) {
  size_t done = 0;
  while (done < size) {
    iovec local{local_data + done, size - done};
    iovec remote{reinterpret_cast<void*>(address + done), size - done};
    const ssize_t n = direction == CmaDirection::kWrite
                          ? ::process_vm_writev(pid, &local, 1, &remote, 1, 0)
                          : ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) {
      errno = EFAULT;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace dtrain::transport::shm
