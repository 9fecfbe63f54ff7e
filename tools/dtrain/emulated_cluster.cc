// Reading the record scripts/netns-hosts.sh keeps of an emulated cluster (/run/dtrain-netns/NAME).
#include "tools/dtrain/emulated_cluster.h"

#include <unistd.h>

#include <fstream>
#include <string>

#include "dtrain/error.h"

namespace dtrain::tools {

std::optional<EmulatedCluster> read_cluster(const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (::geteuid() != 0)
    throw InvalidArgumentError(fmt::format(
        "dtrain bench --netns {}: entering the cluster's network namespaces needs root: run it "
        "with sudo",
        name));
  const std::string path = "/run/dtrain-netns/" + name;
  std::ifstream f(path);
  if (!f)
    throw InvalidArgumentError(fmt::format(
        "dtrain bench --netns {}: no emulated cluster of that name ({} is missing): make it with "
        "scripts/netns-hosts.sh up {} HOSTS SUBNET",
        name, path, name));
  EmulatedCluster c;
  c.name = name;
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("n=", 0) == 0) c.hosts = std::stoi(line.substr(2));
    if (line.rfind("subnet=", 0) == 0) c.subnet = line.substr(7);
  }
  if (c.hosts < 1 || c.subnet.empty())
    throw InvalidArgumentError(
        fmt::format("dtrain bench --netns {}: {} does not say n= and subnet=", name, path));
  return c;
}

}  // namespace dtrain::tools
