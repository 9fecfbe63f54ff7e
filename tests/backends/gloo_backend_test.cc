// The gloo backend against the compact collectives suite (suite.h) in forked processes, world
// sizes 1..4, plus the native backend once for the support table, backend selection (option
// and DTRAIN_BACKEND), the named errors, and a peer that dies mid-job.
#include <gtest/gtest.h>
#include <stdlib.h>

#include "backends/suite.h"
#include "support/expect.h"
#include "support/multiproc.h"

namespace dtrain::testing::backends {
namespace {

using namespace std::chrono_literals;

class GlooWorld : public ::testing::TestWithParam<int> {};

TEST_P(GlooWorld, EveryCollectiveAndSendRecv) {
  const int n = GetParam();
  const int port = free_port();
  expect_all_ok(run_ranks(n, [&](int rank) {
    auto pg = make_group(rank, n, port, {.backend = "gloo"});
    Suite suite{*pg, "gloo", rank == 0 && n == 3};
    suite.all(counts_for(n));
    suite.cuda_refused();
  }, 240s));
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooWorld, ::testing::Values(1, 2, 3, 4));

TEST(NativeBackend, SuiteForTheSupportTable) {
  const int n = 3;
  const int port = free_port();
  expect_all_ok(run_ranks(n, [&](int rank) {
    auto pg = make_group(rank, n, port, {.backend = "native"});
    Suite suite{*pg, "native", rank == 0};
    suite.all(counts_for(n));
  }, 240s));
}

TEST(GlooBackend, SelectedByDtrainBackend) {
  const int port = free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    ::setenv("DTRAIN_BACKEND", "gloo", 1);
    auto pg = make_group(rank, 2, port);
    // Only the gloo backend words its errors so.
    expect_unsupported("gloo", "bf16 all_reduce", [&] {
      std::vector<uint16_t> x(4);
      pg->allreduce(TensorView{x.data(), x.size(), DType::kBF16});
    });
    std::vector<int64_t> v(10, rank + 1);
    pg->allreduce(TensorView::of(v))->wait();
    for (auto x : v) RANK_CHECK(x == 3, "got {}", x);
  }));
}

TEST(Backends, UnknownAndUnbuiltNamesAreRefused) {
  auto store = std::make_shared<FileStore>(::testing::TempDir() + "/backend_names_store", 5s);
  try {
    ProcessGroup::create(store, 0, 1, {.backend = "carrier_pigeon"});
    FAIL() << "an unknown backend was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("use native, gloo, mpi or nccl"), std::string::npos) << e.what();
  }
#ifndef DTRAIN_HAVE_NCCL
  try {
    ProcessGroup::create(store, 0, 1, {.backend = "nccl"});
    FAIL() << "nccl is not built, yet it was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("backend nccl is not built into this dtrain"), std::string::npos)
        << e.what();
  }
#endif
}

// Gloo's multiproc idea: a rank dies; the survivor's collective fails with a dtrain error
// (peer failure, or timeout) within its limit instead of hanging.
TEST(GlooBackend, PeerDeathFailsTheCollective) {
  const int port = free_port();
  auto results = run_ranks(2, [&](int rank) {
    auto pg = make_group(rank, 2, port, {.backend = "gloo"});
    pg->barrier()->wait();
    if (rank == 1) ::_exit(0);
    std::vector<float> x(1 << 16, 1.0f);
    try {
      pg->allreduce(TensorView::of(x), {.timeout = 5s})->wait();
    } catch (const Error& e) {
      RANK_CHECK(e.kind() == ErrorKind::kPeerFailure || e.kind() == ErrorKind::kTimeout,
                 "unexpected kind: {}", e.what());
      RANK_CHECK(std::string(e.what()).find("all_reduce") != std::string::npos, "{}", e.what());
      // The group is unusable now, and says so at once.
      try {
        pg->barrier()->wait();
      } catch (const PeerFailureError&) {
        ::_exit(3);
      }
    }
    ::_exit(4);
  }, 60s);
  EXPECT_EQ(results[0].exit_code, 3);
  EXPECT_FALSE(results[0].timed_out);
}

}  // namespace
}  // namespace dtrain::testing::backends
