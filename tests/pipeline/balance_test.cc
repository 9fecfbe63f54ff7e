// Cutting per-module costs into stages (dtrain/pipeline/balance.h): the least largest part, free
// modules joining the part before them, and too few modules refused.
#include "dtrain/pipeline/balance.h"

#include <gtest/gtest.h>

#include "dtrain/error.h"

namespace dtrain::pipeline {
namespace {

using Cuts = std::vector<size_t>;

TEST(Balance, CutsTheLeastLargestPart) {
  EXPECT_EQ(balance({1, 1, 1, 1}, 2), (Cuts{0, 2, 4}));
  EXPECT_EQ(balance({5, 1, 1, 1, 1, 1}, 2), (Cuts{0, 1, 6}));
  EXPECT_EQ(balance({1, 2, 3, 4, 5}, 3), (Cuts{0, 3, 4, 5}));
  EXPECT_EQ(balance({7}, 1), (Cuts{0, 1}));
}

TEST(Balance, ModulesThatCostNothingJoinThePartBeforeThem) {
  // Flatten, Linear, ReLU, Linear, ReLU, ... : the activations stay with their layer.
  EXPECT_EQ(balance({0, 5, 0, 1, 1, 1, 1, 1, 0}, 2), (Cuts{0, 3, 9}));
  EXPECT_EQ(balance({0, 4, 0, 4, 0}, 2), (Cuts{0, 3, 5}));
}

TEST(Balance, FewerModulesThanStagesAreRefused) {
  try {
    balance({1, 2}, 3);
    FAIL() << "3 parts of 2 modules";
  } catch (const InvalidArgumentError& e) {
    EXPECT_STREQ(e.what(), "balance: 2 modules cannot make 3 stages of at least one module each");
  }
  EXPECT_THROW(balance({1, 2}, 0), InvalidArgumentError);
}

}  // namespace
}  // namespace dtrain::pipeline
