// The allocator `dtrain run` gives its workers: jemalloc, preloaded, with dtrain's settings
// (common/jemalloc_conf.h). Python jobs train faster with it (docs/performance.md): torch's CPU
// tensors come from malloc, and glibc's returns their pages to the kernel every step. A program
// linked with jemalloc (dtrain's LibTorch programs) loads the same library either way. Left
// alone: an LD_PRELOAD that already names an allocator or a sanitizer runtime, and builds without
// jemalloc or with sanitizers (no path).
#pragma once

#include <string>

namespace dtrain::launch {

struct AllocatorPreload {
  std::string ld_preload;   // the workers' LD_PRELOAD; empty: leave it as it is
  std::string malloc_conf;  // the workers' MALLOC_CONF; empty: leave it as it is
  std::string note;         // what the launcher says about it (empty: nothing to say)
};

// `jemalloc` is the library's path (null or empty: none in this build); `ld_preload` and
// `malloc_conf` are the launcher's own values of those variables (null when unset).
AllocatorPreload plan_allocator_preload(const char* jemalloc, const char* ld_preload,
                                        const char* malloc_conf);

}  // namespace dtrain::launch
