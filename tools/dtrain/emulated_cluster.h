// The emulated cluster of `dtrain bench --netns NAME`, as scripts/netns-hosts.sh recorded it:
// hosts NAME-h0.. at SUBNET.1.., this machine at SUBNET.254. Ranks go to the hosts in blocks, as a
// launcher fills nodes. The driver places dtrain's ranks on it and sizes `--algo all` by it; the
// peers' recipes place theirs.
#pragma once

#include <algorithm>
#include <optional>
#include <string>

#include <fmt/format.h>

namespace dtrain::tools {

struct EmulatedCluster {
  std::string name;
  std::string subnet;
  int hosts = 0;
  std::string head() const { return subnet + ".254"; }
  std::string address(int host) const { return fmt::format("{}.{}", subnet, host + 1); }
  int host_of(int rank, int np) const { return rank * std::min(hosts, np) / np; }
  std::string netns(int host) const { return fmt::format("{}-h{}", name, host); }
  int first_rank(int host, int np) const {
    int r = 0;
    while (r < np && host_of(r, np) < host) ++r;
    return r;
  }
  int ranks_on(int host, int np) const {
    int n = 0;
    for (int r = 0; r < np; ++r) n += host_of(r, np) == host;
    return n;
  }
};

// The cluster called `name`, or nullopt for "" (no --netns). Throws InvalidArgumentError when
// this process is not root (it enters the cluster's namespaces) or the cluster was never made.
std::optional<EmulatedCluster> read_cluster(const std::string& name);

}  // namespace dtrain::tools
