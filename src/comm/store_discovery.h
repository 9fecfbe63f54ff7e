// Where the rendezvous store is when the launcher says who each process is but not where rank 0
// listens. mpirun gives every process OMPI_COMM_WORLD_RANK/SIZE but no MASTER_ADDR; Slurm,
// Kubernetes and torchrun name the master themselves, so this only concerns mpirun (and PMI
// launchers such as MPICH's). The rule, when neither MASTER_ADDR, a tcp:// init method nor
// IdentityOptions::master_addr names the master:
//
//  1. A backend linked into the program that shares the launcher's own channel (the mpi backend:
//     MPI_COMM_WORLD under OpenMPI's mpirun) carries the address: rank 0 hosts the store on
//     MASTER_PORT, or on any free port when that is unset, and broadcasts "host:port" to the
//     others. host is DTRAIN_SOCKET_ADDR if rank 0 has it, 127.0.0.1 when every rank runs on one
//     node, else rank 0's host name. If rank 0 cannot start the store, the others get its error.
//  2. Without such a channel, every rank on one node: 127.0.0.1:MASTER_PORT (29500 by default),
//     as resolve_identity says.
//  3. Otherwise an InvalidArgumentError says to set MASTER_ADDR (mpirun -x MASTER_ADDR=...).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "dtrain/identity.h"
#include "dtrain/store.h"

namespace dtrain::comm {

// A channel that reaches every process of the job before any store exists, registered at static
// initialisation by the backend library that provides it (src/backends/mpi/mpi_store_channel.cc).
struct LauncherChannel {
  std::string name;  // "MPI_COMM_WORLD", for logs and errors
  // Whether it reaches processes started this way (mpi: id.source == "openmpi").
  std::function<bool(const Identity& id)> serves;
  // Called by every rank: returns rank 0's `message` on every rank, or throws (TimeoutError
  // naming the channel and the limit) when rank 0 has not sent it within `timeout`.
  std::function<std::string(const Identity& id, const std::string& message,
                            std::chrono::milliseconds timeout)>
      broadcast;
};

// Registers a channel; returns true so that a namespace-scope bool can hold the result.
bool register_launcher_channel(LauncherChannel channel);

// The store for `id` when the rule above applies (cases 1 and 3; case 3 throws), or null when
// the identity already names the store (the caller connects to id.master_addr:master_port).
// `base` carries the timeouts, job id, token and rank of the store connection.
std::shared_ptr<TcpStore> discover_store(const Identity& id, const IdentityOptions& options,
                                         const TcpStoreOptions& base);

}  // namespace dtrain::comm
