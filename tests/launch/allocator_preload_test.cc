// What `dtrain run` does with its workers' allocator (launch/allocator_preload.h), case by case;
// launcher_test runs the real binary.
#include "launch/allocator_preload.h"

#include <gtest/gtest.h>

#include <string>

#include "common/jemalloc_conf.h"

namespace dtrain::launch {
namespace {

TEST(AllocatorPreload, JemallocGoesFirstWithDtrainsSettings) {
  const std::string self = "/proc/self/exe";  // a file that exists, standing in for the library
  auto plan = plan_allocator_preload(self.c_str(), nullptr, nullptr);
  EXPECT_EQ(plan.ld_preload, self);
  EXPECT_EQ(plan.malloc_conf, kJemallocConf);
  EXPECT_NE(plan.note.find("--no-jemalloc"), std::string::npos) << plan.note;

  plan = plan_allocator_preload(self.c_str(), "/opt/libfaketime.so", "narenas:1");
  EXPECT_EQ(plan.ld_preload, self + ":/opt/libfaketime.so");
  EXPECT_EQ(plan.malloc_conf, "");  // the user's is kept
  EXPECT_NE(plan.note.find("MALLOC_CONF=narenas:1"), std::string::npos) << plan.note;
}

TEST(AllocatorPreload, AnAllocatorOrSanitizerAlreadyPreloadedIsKept) {
  for (const char* preload : {"/usr/lib/libtcmalloc_minimal.so.4", "/x/libjemalloc.so.2",
                              "/usr/lib/libmimalloc.so", "/usr/lib/gcc/libasan.so.8"}) {
    auto plan = plan_allocator_preload("/proc/self/exe", preload, nullptr);
    EXPECT_EQ(plan.ld_preload, "") << preload;
    EXPECT_EQ(plan.malloc_conf, "") << preload;
    EXPECT_NE(plan.note.find("the workers keep it"), std::string::npos) << plan.note;
  }
}

TEST(AllocatorPreload, NoLibraryChangesNothingAndAMissingOneIsSaid) {
  auto none = plan_allocator_preload(nullptr, nullptr, nullptr);
  EXPECT_EQ(none.ld_preload, "");
  EXPECT_EQ(none.note, "");
  auto missing = plan_allocator_preload("/nonexistent/libjemalloc.so.2", nullptr, nullptr);
  EXPECT_EQ(missing.ld_preload, "");
  EXPECT_EQ(missing.malloc_conf, "");
  EXPECT_NE(missing.note.find("jemalloc is not at /nonexistent/libjemalloc.so.2"),
            std::string::npos)
      << missing.note;
}

}  // namespace
}  // namespace dtrain::launch
