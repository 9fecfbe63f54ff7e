// gtest expectations over forked ranks (multiproc.h).
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "support/multiproc.h"

namespace dtrain::testing {

// Every rank ended by itself, with exit code 0.
inline void expect_all_ok(const std::vector<ChildResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " timed out";
    EXPECT_EQ(results[r].signal, 0) << "rank " << r << " died of signal " << results[r].signal;
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " failed";
  }
}

}  // namespace dtrain::testing
