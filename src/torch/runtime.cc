// Threads, BLAS and allocator for LibTorch (see dtrain/torch/runtime.h for why).
#include "dtrain/torch/runtime.h"

#include <dlfcn.h>
#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include <ATen/Parallel.h>

#include "common/env.h"

namespace dtrain {

namespace {

int default_threads() {
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int local = static_cast<int>(env::get_int(env::kLocalWorldSize).value_or(1));
  return std::max(1, cores / std::max(1, local));
}

std::string configure_allocator() {
  // jemalloc exports mallctl; when it resolves, jemalloc is the process's malloc.
  if (dlsym(RTLD_DEFAULT, "mallctl") != nullptr) return "jemalloc";
  // glibc: keep large blocks in the heap instead of mmap/munmap per allocation, and never trim
  // the top of the heap back to the kernel, so step buffers are reused without page faults.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
  return "glibc (mallopt tuned; install libjemalloc-dev and rebuild for jemalloc)";
}

}  // namespace

RuntimeInfo configure_runtime(int threads) {
  RuntimeInfo info;
  info.threads = threads > 0 ? threads : default_threads();
  info.allocator = configure_allocator();

  using SetThreads = void (*)(int);
  using GetConfig = char* (*)();
  auto set_blas_threads = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  auto blas_config = reinterpret_cast<GetConfig>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  if (set_blas_threads != nullptr) set_blas_threads(info.threads);
  if (blas_config != nullptr) {
    info.blas = std::string("OpenBLAS ") + blas_config();
    info.fast_blas = true;
  } else {
    info.blas =
        "reference BLAS (slow: install libopenblas0-pthread, which the alternatives system then "
        "makes libblas.so.3)";
  }

  at::set_num_threads(info.threads);
  // Inter-op threads can be set once per process only; a second call throws.
  static const bool interop_set = [&] {
    at::set_num_interop_threads(1);
    return true;
  }();
  (void)interop_set;
  return info;
}

}  // namespace dtrain
