// The argument checks every backend shares (src/comm/arguments.h), without processes.
#include "comm/arguments.h"

#include <gtest/gtest.h>

#include <vector>

namespace dtrain::comm {
namespace {

TEST(Arguments, AllToAllVCountsWhatThisRankSendsAndReceivesUnderTheirOwnNames) {
  std::vector<float> out(10), in(10);
  const GroupInfo info{.rank = 1, .size = 3};
  // Rank 1 receives 1 + 2 + 1 = 4 elements and sends 2 + 2 + 2 = 6.
  const auto totals = check_alltoallv(info, TensorView::of(out), {1, 2, 1}, TensorView::of(in),
                                      {2, 2, 2});
  EXPECT_EQ(totals.out, 4u);
  EXPECT_EQ(totals.in, 6u);
  EXPECT_EQ(totals.describe(DType::kF32), "f32, sends 6 elements, receives 4");
}

TEST(Arguments, AllToAllVCountsBeyondTheTensorsAreNamed) {
  std::vector<float> out(3), in(10);
  try {
    check_alltoallv({.rank = 0, .size = 2}, TensorView::of(out), {2, 2}, TensorView::of(in),
                    {2, 2});
    FAIL() << "4 elements into a tensor of 3";
  } catch (const InvalidArgumentError& e) {
    EXPECT_STREQ(e.what(),
                 "rank 0: all_to_all_v: the counts add up to 4 output and 4 input elements, but "
                 "the tensors have 3 and 10");
  }
}

}  // namespace
}  // namespace dtrain::comm
