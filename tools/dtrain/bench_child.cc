// The environment of a rank `dtrain bench`'s driver starts, and where it runs.
#include "tools/dtrain/bench_child.h"

namespace dtrain::tools {

std::vector<std::pair<std::string, std::string>> rank_env(int rank, int np, uint16_t port) {
  return {{"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(np)},
          {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(np)},
          {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", std::to_string(port)},
          {"DTRAIN_AGENT_STORE", "1"}};
}

void place(ChildSpec& s, const EmulatedCluster& c, int rank, int np, const std::string& master) {
  const int host = c.host_of(rank, np);
  s.netns = c.netns(host);
  for (auto& [k, v] : s.env) {
    if (k == "LOCAL_RANK") v = std::to_string(rank - c.first_rank(host, np));
    if (k == "LOCAL_WORLD_SIZE") v = std::to_string(c.ranks_on(host, np));
    if (k == "MASTER_ADDR") v = master;
  }
}

std::filesystem::path self_exe() { return std::filesystem::read_symlink("/proc/self/exe"); }

}  // namespace dtrain::tools
