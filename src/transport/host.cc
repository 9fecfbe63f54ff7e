#include "transport/host.h"

#include <unistd.h>

#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/env.h"
#include "dtrain/error.h"

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

std::string rack_identity(const std::string& address) {
  if (auto rack = env::raw(env::kRack)) return *rack;
  const auto path = env::raw(env::kTopology);
  if (!path) return {};
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  std::ifstream f(*path);
  if (!f)
    throw InvalidArgumentError(fmt::format(
        "DTRAIN_TOPOLOGY names '{}', which cannot be read: give a readable file, or unset it",
        *path));
  std::string found;
  try {
    const auto j = nlohmann::json::parse(f);
    for (const auto& [rack, hosts] : j.at("racks").items()) {
      for (const auto& h : hosts) {
        const auto name = h.get<std::string>();
        if (name != host && name != address) continue;
        if (!found.empty() && found != rack)
          throw InvalidArgumentError(
              fmt::format("DTRAIN_TOPOLOGY '{}' puts host {} in two racks, {} and {}", *path, name,
                          found, rack));
        found = rack;
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgumentError(fmt::format(
        "DTRAIN_TOPOLOGY '{}' is not {{\"racks\": {{\"RACK\": [\"HOST or ADDRESS\", ...]}}}}: {}",
        *path, e.what()));
  }
  return found;
}

}  // namespace dtrain::transport
