// A parameter-server job's roles, read from whichever convention launched the process:
//   dtrain run --servers S -n N   DTRAIN_ROLE=server|worker, DTRAIN_PS_INDEX (servers), RANK
//                                 (workers), DTRAIN_NUM_SERVERS, DTRAIN_NUM_WORKERS or WORLD_SIZE,
//                                 MASTER_ADDR/MASTER_PORT for the store the servers publish in
//   TensorFlow                    TF_CONFIG {"cluster": {"ps": [...], "worker": [...],
//                                 "chief": [...]}, "task": {"type": "ps", "index": 0}}; the
//                                 servers' addresses come from the cluster, no store is needed
//   ps-lite / BytePS              DMLC_ROLE=server|worker|scheduler, DMLC_NUM_SERVER,
//                                 DMLC_NUM_WORKER, DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT (the
//                                 scheduler hosts the store there; indexes are handed out by it)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/identity.h"

namespace dtrain::ps {

struct Cluster {
  enum class Role { kWorker, kServer, kScheduler };
  Role role = Role::kWorker;
  // This process's index among its role; -1 when the store hands it out (ps-lite).
  int index = 0;
  int num_servers = 1;
  int num_workers = 1;
  // The servers' addresses when the convention lists them (TF_CONFIG); otherwise the servers
  // publish theirs in the store at store_addr:store_port.
  std::vector<std::string> servers;
  std::string store_addr = "127.0.0.1";
  uint16_t store_port = 29500;
  std::string source;  // "dtrain", "tf_config" or "dmlc"
};

const char* to_string(Cluster::Role role);

// Throws InvalidArgumentError naming the variable when the environment is contradictory or
// incomplete.
Cluster resolve_cluster();
Cluster resolve_cluster(const EnvLookup& lookup);

}  // namespace dtrain::ps
