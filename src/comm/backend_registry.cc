#include "comm/backend_registry.h"

#include <map>
#include <mutex>

#include <fmt/format.h>

#include "common/env.h"
#include "dtrain/error.h"

namespace dtrain::backends {
namespace {

struct KnownBackend {
  std::string_view name;
  std::string_view how_to_build;
};

// Every backend name dtrain knows, whether or not this build has it.
constexpr KnownBackend kKnown[] = {
    {"native", ""},
    {"gloo",
     "install libgloo-dev and rebuild; a program that links LibTorch never has it (a torch wheel "
     "carries a Gloo of its own, which cannot share a process with Debian's)"},
    {"mpi", "install libopenmpi-dev and rebuild"},
    {"nccl", "build on a machine with the CUDA toolkit and NCCL in /usr/local/cuda"},
};

struct Registry {
  std::mutex mu;  // guards backends
  std::map<std::string, Backend, std::less<>> backends;
};

// A function-local static: backends register during static initialisation, in any order.
Registry& registry() {
  static Registry r;
  return r;
}

const KnownBackend* known(std::string_view name) {
  for (const auto& k : kKnown)
    if (k.name == name) return &k;
  return nullptr;
}

}  // namespace

bool register_backend(Backend backend) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  std::string name = backend.name;
  r.backends.insert_or_assign(std::move(name), std::move(backend));
  return true;
}

std::string selected_backend(const ProcessGroupOptions& options) {
  std::string name = options.backend;
  std::string from = "ProcessGroupOptions::backend";
  if (name.empty()) {
    name = env::get_string(env::kBackend);
    from = "DTRAIN_BACKEND";
  }
  if (name.empty()) return "native";
  if (!known(name))
    throw InvalidArgumentError(
        fmt::format("{} is '{}': that is no backend; use native, gloo, mpi or nccl", from, name));
  return name;
}

const Backend* built_backend(std::string_view name) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.backends.find(name);
  return it == r.backends.end() ? nullptr : &it->second;
}

const Backend* find_backend(std::string_view name) {
  if (name == "native") return nullptr;
  if (const Backend* b = built_backend(name)) return b;
  const KnownBackend* k = known(name);
  if (!k)
    throw InvalidArgumentError(
        fmt::format("backend '{}' is no backend; use native, gloo, mpi or nccl", name));
  throw InvalidArgumentError(fmt::format(
      "backend {} is not built into this dtrain: {} (programs get it by linking the CMake "
      "target dtrain_backends)",
      name, k->how_to_build));
}

bool needs_store(const ProcessGroupOptions& options) {
  const Backend* b = find_backend(selected_backend(options));
  return b == nullptr || b->needs_store;
}

std::shared_ptr<ProcessGroup> create_registered(std::shared_ptr<Store> store, int rank, int size,
                                                const ProcessGroupOptions& options) {
  const Backend* b = find_backend(selected_backend(options));
  if (b == nullptr) return nullptr;
  return b->create(std::move(store), rank, size, options);
}

}  // namespace dtrain::backends
