// TF_CONFIG: the cluster TensorFlow's distribution strategies read from the environment, for the
// processes `dtrain run --tf-config` starts on one node. Without servers every worker is a
// "worker" (MultiWorkerMirroredStrategy; worker 0 acts as its chief); with servers rank 0 is the
// "chief" (ParameterServerStrategy's coordinator), the other ranks "worker"s and the servers
// "ps" tasks. Each task gets a port free when the configs are made.
#pragma once

#include <string>
#include <vector>

namespace dtrain::launch {

struct TfConfigs {
  std::vector<std::string> workers;  // by rank: the JSON for TF_CONFIG
  std::vector<std::string> servers;  // by server index
};

// `host`: the address every task is reached at (the node's).
TfConfigs tf_configs(const std::string& host, int workers, int servers);

}  // namespace dtrain::launch
