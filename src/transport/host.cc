#include "transport/host.h"

#include <unistd.h>

#include <fstream>

#include <fmt/format.h>

namespace dtrain::transport {

std::string host_identity() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  char ns[128] = {0};
  ssize_t n = ::readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
  return fmt::format("{}|{}|{}", host, boot, n > 0 ? std::string(ns, n) : "?");
}

}  // namespace dtrain::transport
