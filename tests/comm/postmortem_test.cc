// The post-mortem's collection through a real store: it waits for the ranks that may still write,
// and not for those that cannot (their connection broke, or they wrote about the collective they
// failed in, another one).
#include "comm/postmortem.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "dtrain/store.h"
#include "support/temp_dir.h"

namespace dtrain::comm {
namespace {

using Clock = std::chrono::steady_clock;

TEST(Postmortem, ARankThatWroteAboutAnotherCollectiveIsNotWaitedFor) {
  testing::TempDir dir;
  FileStore store(dir.path + "/store");
  // Rank 0 failed in #7; rank 1 completed #7 and failed in #8; rank 2's connection broke.
  publish_postmortem(store, "world", 0, 7, "called all_gather(u8, 137) and failed");
  publish_postmortem(store, "world", 1, 8, "called all_gather(u8, 137) and failed");
  const auto start = Clock::now();
  const std::string text = collect_postmortem(
      store, "world", 3, 7, std::chrono::seconds(3),
      [](int r) -> std::optional<std::string> {
        if (r == 2) return "gone (its connection broke)";
        return std::nullopt;
      });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1)) << text;
  EXPECT_NE(text.find("rank 0 called all_gather(u8, 137) and failed"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1 has no entry for #7; its latest: at collective #8 called "
                      "all_gather(u8, 137) and failed"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rank 2: gone (its connection broke)"), std::string::npos) << text;
}

TEST(Postmortem, ARankThatHasNotWrittenIsWaitedForUpToTheLimit) {
  testing::TempDir dir;
  FileStore store(dir.path + "/store");
  publish_postmortem(store, "world", 0, 3, "called barrier() and failed");
  const auto start = Clock::now();
  const std::string text =
      collect_postmortem(store, "world", 2, 3, std::chrono::milliseconds(400));
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(400)) << text;
  EXPECT_NE(text.find("rank 1: no word within"), std::string::npos) << text;
}

}  // namespace
}  // namespace dtrain::comm
