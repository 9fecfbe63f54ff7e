// The LibTorch fast path: threads, BLAS and allocator, set once at start-up.
//
//   auto info = dtrain::configure_runtime(/*threads=*/0);   // 0 = cores / LOCAL_WORLD_SIZE
//
// Why: Debian's LibTorch runs its matrix products on whatever libblas.so.3 the alternatives
// system points at (the reference BLAS is ~30x slower than OpenBLAS, libopenblas0-pthread), and
// glibc malloc hands LibTorch's large step buffers back to the kernel every step (millions of
// page faults). dtrain_torch links jemalloc when it is installed; otherwise this tunes glibc.
#pragma once

#include <cstdint>
#include <string>

namespace dtrain {

struct RuntimeInfo {
  int threads = 1;        // intra-op threads of LibTorch and OpenBLAS
  std::string allocator;  // "jemalloc" or "glibc (mallopt tuned)"
  std::string blas;       // "OpenBLAS ..." or a warning that the reference BLAS is in use
  bool fast_blas = false;
};

// Sets LibTorch's intra-op and inter-op threads and OpenBLAS's threads to `threads` (0 = the
// machine's cores divided by LOCAL_WORLD_SIZE, at least 1), tunes glibc malloc when jemalloc is
// not the allocator, and reports what is in use. Call it before the first tensor operation.
RuntimeInfo configure_runtime(int threads = 0);

// The most heap bytes the calling thread had allocated and not yet freed since the last
// reset_thread_peak_memory() (jemalloc's thread.peak): what a stretch of training needed, unlike
// the resident set, which an allocator keeps. -1 when the allocator cannot say (glibc malloc).
int64_t thread_peak_memory();
void reset_thread_peak_memory();
// The heap bytes the process holds now, whichever thread allocated them (jemalloc's
// stats.allocated): the difference of two readings is what a stretch of code kept, e.g. the
// model states. -1 without jemalloc.
int64_t heap_allocated_memory();

}  // namespace dtrain
