// TF_CONFIG for the tasks of one node (see tf_config.h).
#include "launch/tf_config.h"

#include <nlohmann/json.hpp>

#include "common/socket.h"

namespace dtrain::launch {

TfConfigs tf_configs(const std::string& host, int workers, int servers) {
  // Ports nothing listens on now (the kernel's choice; each task binds its own moments later).
  // The probes stay open until all are chosen, so that no two tasks get the same one.
  std::vector<net::Fd> probes;
  auto address = [&] {
    probes.push_back(net::listen_tcp(host, 0));
    return net::HostPort{host, net::local_port(probes.back().get())}.to_string();
  };
  nlohmann::json cluster = nlohmann::json::object();
  std::vector<std::pair<std::string, int>> tasks;  // by rank: type, index
  for (int r = 0; r < workers; ++r) {
    const std::string type = servers > 0 && r == 0 ? "chief" : "worker";
    tasks.emplace_back(type, static_cast<int>(cluster[type].size()));
    cluster[type].push_back(address());
  }
  for (int i = 0; i < servers; ++i) cluster["ps"].push_back(address());
  auto config = [&](const std::string& type, int index) {
    return nlohmann::json{{"cluster", cluster}, {"task", {{"type", type}, {"index", index}}}}
        .dump();
  };
  TfConfigs out;
  for (const auto& [type, index] : tasks) out.workers.push_back(config(type, index));
  for (int i = 0; i < servers; ++i) out.servers.push_back(config("ps", i));
  return out;
}

}  // namespace dtrain::launch
