#include "launch/allocator_preload.h"

#include <filesystem>
#include <string_view>

#include <fmt/format.h>

#include "common/jemalloc_conf.h"

namespace dtrain::launch {

AllocatorPreload plan_allocator_preload(const char* jemalloc, const char* ld_preload,
                                        const char* malloc_conf) {
  AllocatorPreload plan;
  if (jemalloc == nullptr || *jemalloc == '\0') return plan;
  const std::string_view preload = ld_preload ? ld_preload : "";
  for (std::string_view own : {"jemalloc", "tcmalloc", "mimalloc", "libasan", "libtsan"}) {
    if (preload.find(own) != std::string_view::npos) {
      plan.note = fmt::format("dtrain run: LD_PRELOAD names {} already ({}): the workers keep it",
                              own, preload);
      return plan;
    }
  }
  std::error_code ec;
  if (!std::filesystem::exists(jemalloc, ec)) {
    plan.note = fmt::format(
        "dtrain run: jemalloc is not at {} on this machine: the workers keep their malloc "
        "(install libjemalloc2 for the speed, or --no-jemalloc to say so)",
        jemalloc);
    return plan;
  }
  plan.ld_preload =
      preload.empty() ? std::string(jemalloc) : fmt::format("{}:{}", jemalloc, preload);
  if (malloc_conf == nullptr) plan.malloc_conf = kJemallocConf;
  plan.note = fmt::format(
      "dtrain run: the workers start with jemalloc preloaded ({}, MALLOC_CONF={}); "
      "--no-jemalloc to leave their allocator alone",
      jemalloc, malloc_conf ? malloc_conf : kJemallocConf);
  return plan;
}

}  // namespace dtrain::launch
