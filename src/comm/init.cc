#include <fmt/format.h>

#include "comm/backend_registry.h"
#include "comm/store_discovery.h"
#include "common/env.h"
#include "common/log.h"
#include "dtrain/error.h"
#include "dtrain/process_group.h"

namespace dtrain {

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options) {
  // A backend with its own rendezvous (mpi: mpirun's) needs neither identity nor store.
  if (!backends::needs_store(options.group))
    return ProcessGroup::create(nullptr, -1, -1, options.group);
  Identity id = resolve_identity(options.identity);
  log::set_rank(id.rank);
  const auto timeout =
      options.group.timeout.count() > 0 ? options.group.timeout : env::get_seconds(env::kTimeout);
  const auto connect_timeout = options.group.connect_timeout.count() > 0
                                   ? options.group.connect_timeout
                                   : env::get_seconds(env::kConnectTimeout);
  std::shared_ptr<Store> store;
  if (id.store_kind == "file") {
    store = std::make_shared<FileStore>(id.store_path, timeout);
    DTRAIN_LOG_DEBUG("rank {} of {} ({}), file store {}", id.rank, id.world_size, id.source,
                     id.store_path);
  } else {
    TcpStoreOptions so;
    so.host = id.master_addr;
    so.port = id.master_port;
    // Rank 0 hosts the store unless the launcher already does; a world of one needs no fixed
    // port, so it takes any free one.
    const bool agent_store = env::get_bool(env::kAgentStore);
    so.is_server = id.rank == 0 && !agent_store;
    if (id.world_size == 1 && !agent_store) so.port = 0;
    so.timeout = timeout;
    so.connect_timeout = connect_timeout;
    so.rank = id.rank;
    so.job_id = options.group.job_id;
    so.token = options.group.token;
    // mpirun names no master: rank 0's address may come through MPI (comm/store_discovery.h).
    std::shared_ptr<TcpStore> tcp =
        agent_store ? nullptr : comm::discover_store(id, options.identity, so);
    if (!tcp) tcp = std::make_shared<TcpStore>(so);
    DTRAIN_LOG_DEBUG("rank {} of {} ({}), store {}:{}", id.rank, id.world_size, id.source,
                     tcp->host(), tcp->port());
    store = std::move(tcp);
  }
  return ProcessGroup::create(store, id.rank, id.world_size, options.group);
}

}  // namespace dtrain
