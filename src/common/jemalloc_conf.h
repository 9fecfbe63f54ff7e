// jemalloc's settings for training: keep freed pages instead of purging them. Its defaults hand
// freed pages back to the kernel within seconds, and at once for blocks of 8 MiB and more, while
// LibTorch frees and re-allocates the same tens of MB every step, so every step faults them in
// again (docs/performance.md measures the cost). Kept, the process's peak stays resident, as with
// PyTorch's caching allocators. dtrain's LibTorch programs compile it in (src/torch/runtime.cc);
// `dtrain run` gives it to the workers it preloads jemalloc into (launch/allocator_preload.h).
#pragma once

namespace dtrain {

inline constexpr const char* kJemallocConf =
    "oversize_threshold:0,dirty_decay_ms:-1,muzzy_decay_ms:-1";

}  // namespace dtrain
