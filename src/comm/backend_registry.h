// The backends behind ProcessGroup::create: native (dtrain's own transport, always there) and
// the optional ones (gloo, mpi, nccl), which live in their own static libraries and register a
// factory here when they are linked in. dtrain_core thus never depends on Gloo, MPI or CUDA; a
// program gets the optional backends by linking the `dtrain_backends` CMake target, which
// links every backend library that was built, whole-archive so that its registration runs.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "dtrain/process_group.h"

namespace dtrain::backends {

using Factory = std::function<std::shared_ptr<ProcessGroup>(
    std::shared_ptr<Store> store, int rank, int size, const ProcessGroupOptions& options)>;

struct Backend {
  std::string name;
  // False for backends with their own rendezvous (mpi: mpirun's): init_process_group then
  // skips the store and passes rank = size = -1, meaning "ask the backend's runtime".
  bool needs_store = true;
  Factory create;
  // True for backends that move GPU memory only (nccl): ProcessGroup::create pairs their group
  // with a native one for host tensors (comm/per_device_group.h).
  bool device_memory_only = false;
  // The version code of the library it was built against, where it has one (nccl's
  // NCCL_VERSION_CODE, what Horovod's nccl_built() returns); 0 otherwise.
  int version = 0;
};

// Registers a backend; returns true so that a namespace-scope bool can hold the result (the
// registration then runs at static initialisation of the backend's library).
bool register_backend(Backend backend);

// The backend `options` select: options.backend, else DTRAIN_BACKEND, else "native".
// Throws InvalidArgumentError for a name that is no backend at all.
std::string selected_backend(const ProcessGroupOptions& options);

// The registered backend of that name; throws InvalidArgumentError ("backend gloo is not built
// into this dtrain: ...") when it is known but not linked in. Null for "native".
const Backend* find_backend(std::string_view name);

// The registered backend of that name, or null when this program does not have it (never
// throws: for asking what a build has, as Horovod's nccl_built() does). Null for "native",
// which every program has and none registers.
const Backend* built_backend(std::string_view name);

// Whether the selected backend needs the rendezvous store (native does).
bool needs_store(const ProcessGroupOptions& options);

// The group of the selected backend, or null when that is native (the caller builds it).
std::shared_ptr<ProcessGroup> create_registered(std::shared_ptr<Store> store, int rank, int size,
                                                const ProcessGroupOptions& options);

}  // namespace dtrain::backends
