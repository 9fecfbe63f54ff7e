// ProcessGroup::irecv_any: a receive from whichever rank sends first, over TCP and shared
// memory, in real processes: the sender it names, messages with other tags left alone, early
// and late messages, a timeout that says what it waited for, and an explicit wait that outlasts
// the receive's own timeout.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "dtrain/error.h"
#include "support/expect.h"
#include "support/group.h"
#include "support/multiproc.h"

namespace dtrain::testing {
namespace {

using namespace std::chrono_literals;

class AnySource : public ::testing::TestWithParam<const char*> {};

TEST_P(AnySource, TakesEachMessageFromWhoeverSentItInTheOrderTheyCame) {
  const int port = free_port();
  const std::string transport = GetParam();
  expect_all_ok(run_ranks(4, [&](int rank) {
    auto pg = make_group(rank, 4, port, {.transport = transport});
    if (rank == 0) {
      // A message with another tag, sent first, must stay for its own receive.
      std::vector<int64_t> other(2);
      std::vector<int> order;
      for (int i = 0; i < 3; ++i) {
        std::vector<int64_t> got(5, -1);
        auto w = pg->irecv_any(TensorView::of(got), /*tag=*/7);
        w->wait();
        const int src = w->source_rank();
        RANK_CHECK(src >= 1 && src <= 3, "source_rank {}", src);
        RANK_CHECK(got == std::vector<int64_t>(5, src * 10), "message from {} holds {}", src, got[0]);
        order.push_back(src);
      }
      // Ranks 3, 1, 2 send in that order, far enough apart to arrive so.
      RANK_CHECK((order == std::vector<int>{3, 1, 2}), "order {} {} {}", order[0], order[1], order[2]);
      pg->recv(TensorView::of(other), 2, /*tag=*/8);
      RANK_CHECK(other == std::vector<int64_t>(2, 99), "the tag-8 message was taken");
    } else {
      if (rank == 2) {
        std::vector<int64_t> early(2, 99);
        pg->send(TensorView::of(early), 0, 8);
      }
      std::this_thread::sleep_for(rank == 3 ? 0ms : rank == 1 ? 300ms : 600ms);
      std::vector<int64_t> v(5, rank * 10);
      pg->send(TensorView::of(v), 0, 7);
    }
    pg->barrier()->wait();
  }));
}

TEST_P(AnySource, ATimeoutSaysWhatItWaitedFor) {
  const int port = free_port();
  const std::string transport = GetParam();
  expect_all_ok(run_ranks(2, [&](int rank) {
    auto pg = make_group(rank, 2, port, {.transport = transport});
    if (rank == 0) {
      std::vector<float> v(4);
      auto start = std::chrono::steady_clock::now();
      try {
        pg->irecv_any(TensorView::of(v), 5, {.timeout = 300ms})->wait();
        RANK_CHECK(false, "a receive nobody sent to completed");
      } catch (const TimeoutError& e) {
        std::string m = e.what();
        RANK_CHECK(m.find("any source") != std::string::npos && m.find("tag 5") != std::string::npos &&
                       m.find("16 bytes") != std::string::npos,
                   "message: {}", m);
        RANK_CHECK(std::chrono::steady_clock::now() - start < 5s, "took too long");
      }
    }
    pg->barrier()->wait();
  }));
}

// A wait given its own timeout waits that long, even past the operation's own deadline (which
// only a wait without one is held to): a receive of 100 ms whose message comes after 400 ms
// completes under wait(2 s), from one peer or any.
TEST_P(AnySource, AnExplicitWaitOutlastsTheOperationsOwnTimeout) {
  const int port = free_port();
  const std::string transport = GetParam();
  expect_all_ok(run_ranks(2, [&](int rank) {
    auto pg = make_group(rank, 2, port, {.transport = transport});
    for (int any = 0; any < 2; ++any) {
      std::vector<int32_t> v(4, rank);
      if (rank == 0) {
        auto w = any ? pg->irecv_any(TensorView::of(v), 9, {.timeout = 100ms})
                     : pg->irecv(TensorView::of(v), 1, 9, {.timeout = 100ms});
        std::this_thread::sleep_for(200ms);  // past the receive's own deadline
        w->wait(2s);
        RANK_CHECK(v == std::vector<int32_t>(4, 1), "{}: received {}", any ? "any" : "rank 1", v[0]);
      } else {
        std::this_thread::sleep_for(400ms);
        pg->send(TensorView::of(v), 0, 9);
      }
      pg->barrier()->wait();
    }
  }));
}

INSTANTIATE_TEST_SUITE_P(Transports, AnySource, ::testing::Values("tcp", "shm"));

}  // namespace
}  // namespace dtrain::testing
