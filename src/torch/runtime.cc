// Threads, BLAS and allocator for LibTorch (see dtrain/torch/runtime.h for why).
#include "dtrain/torch/runtime.h"

#include <dlfcn.h>
#include <malloc.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <thread>

#include <ATen/Parallel.h>

#include "common/env.h"
#include "common/jemalloc_conf.h"
#include "dtrain/error.h"
#include "dtrain/identity.h"

// jemalloc's start-up options (common/jemalloc_conf.h says why), read when it initialises, before
// main; MALLOC_CONF, read after it, wins.
extern "C" {
const char* malloc_conf = dtrain::kJemallocConf;
}

namespace dtrain {

namespace {

int default_threads() {
  // OMP_NUM_THREADS is the user's word, as in PyTorch.
  if (auto omp = env::get_int(env::kOmpNumThreads); omp && *omp > 0) return static_cast<int>(*omp);
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Bound to fewer CPUs (by `dtrain run`, which gives each worker its share, by taskset or a
  // cpuset): exactly those. Otherwise the local ranks share the machine, counted by whichever
  // launcher started them (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE, Slurm's tasks per node):
  // without it, each rank under mpirun took every core and they all fought over them.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && CPU_COUNT(&allowed) < cores)
    return std::max(1, CPU_COUNT(&allowed));
  int local = 1;
  try {
    local = resolve_identity().local_world_size;
  } catch (const Error&) {
    // Contradictory launcher variables: init_process_group reports them, naming each.
  }
  return std::max(1, cores / std::max(1, local));
}

using Mallctl = int (*)(const char*, void*, size_t*, void*, size_t);

// jemalloc exports mallctl; when it resolves, jemalloc is the process's malloc.
Mallctl find_mallctl() { return reinterpret_cast<Mallctl>(dlsym(RTLD_DEFAULT, "mallctl")); }

std::string configure_allocator() {
  if (auto mallctl = find_mallctl()) {
    ssize_t decay = 0;
    size_t size = sizeof(decay);
    if (mallctl("opt.dirty_decay_ms", &decay, &size, nullptr, 0) == 0 && decay < 0)
      return "jemalloc (pages kept)";
    // MALLOC_CONF said so, or jemalloc was preloaded and started before dtrain was loaded.
    return "jemalloc (purges freed pages: MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 "
           "keeps them)";
  }
  // glibc: keep large blocks in the heap instead of mmap/munmap per allocation, and never trim
  // the top of the heap back to the kernel, so step buffers are reused without page faults.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
  return "glibc (mallopt tuned; install libjemalloc-dev and rebuild for jemalloc)";
}

// Threads of LibTorch and OpenBLAS, the allocator, and what is in use.
RuntimeInfo apply(int threads) {
  RuntimeInfo info;
  info.threads = threads > 0 ? threads : default_threads();
  info.allocator = configure_allocator();

  using SetThreads = void (*)(int);
  using GetConfig = char* (*)();
  auto set_blas_threads =
      reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  auto blas_config = reinterpret_cast<GetConfig>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  if (set_blas_threads != nullptr) set_blas_threads(info.threads);
  if (blas_config != nullptr) {
    info.blas = blas_config();  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..."
    info.fast_blas = true;
  } else {
    info.blas =
        "reference BLAS (slow: install libopenblas0-pthread, which the alternatives system then "
        "makes libblas.so.3)";
  }

  at::set_num_threads(info.threads);
  return info;
}

// Every program linked with dtrain_torch starts with the fast defaults, before main, whether or
// not it calls configure_runtime(). Nothing here may throw out of a static initializer.
const bool kDefaultsApplied = [] {
  try {
    apply(0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain: could not apply LibTorch's thread defaults: %s\n", e.what());
  }
  return true;
}();

}  // namespace

RuntimeInfo configure_runtime(int threads) {
  RuntimeInfo info = apply(threads);
  // Inter-op threads can be set once per process only; a second call throws.
  static const bool interop_set = [&] {
    at::set_num_interop_threads(1);
    return true;
  }();
  (void)interop_set;
  return info;
}

int64_t thread_peak_memory() {
  auto mallctl = find_mallctl();
  uint64_t peak = 0;
  size_t size = sizeof(peak);
  if (mallctl == nullptr || mallctl("thread.peak.read", &peak, &size, nullptr, 0) != 0) return -1;
  return static_cast<int64_t>(peak);
}

void reset_thread_peak_memory() {
  if (auto mallctl = find_mallctl()) mallctl("thread.peak.reset", nullptr, nullptr, nullptr, 0);
}

int64_t heap_allocated_memory() {
  auto mallctl = find_mallctl();
  if (mallctl == nullptr) return -1;
  uint64_t epoch = 1;  // jemalloc's statistics are a snapshot, refreshed by writing the epoch
  size_t size = sizeof(epoch);
  mallctl("epoch", &epoch, &size, &epoch, size);
  size_t allocated = 0;
  size = sizeof(allocated);
  if (mallctl("stats.allocated", &allocated, &size, nullptr, 0) != 0) return -1;
  return static_cast<int64_t>(allocated);
}

}  // namespace dtrain
