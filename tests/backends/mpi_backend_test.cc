// The mpi backend against the compact collectives suite (suite.h). Runs under mpirun (ctest
// starts `mpirun -np 3`): every rank runs every test, in the same order.
#include <gtest/gtest.h>

#include "backends/suite.h"

namespace dtrain::testing::backends {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<ProcessGroup> world() {
  InitOptions o;
  o.group.backend = "mpi";
  o.group.timeout = 60s;
  return init_process_group(o);
}

TEST(MpiBackend, EveryCollectiveAndSendRecv) {
  auto pg = world();
  const int n = pg->size();
  Suite suite{*pg, "mpi", pg->rank() == 0};
  suite.all({0, 1, 7, static_cast<size_t>(n) * 13 + 1, (size_t{1} << 20) + 3});
  suite.cuda_refused();
}

TEST(MpiBackend, SubGroupsOfOneAndTwo) {
  auto pg = world();
  if (pg->size() < 3) GTEST_SKIP() << "needs mpirun -np 3 or more";
  auto pair = pg->new_group({2, 1});
  auto one = pg->new_group({0});
  ASSERT_EQ(pair != nullptr, pg->rank() == 1 || pg->rank() == 2);
  ASSERT_EQ(one != nullptr, pg->rank() == 0);
  for (auto* g : {pair.get(), one.get()}) {
    if (!g) continue;
    Suite suite{*g, "mpi", false};
    suite.reductions({0, 1, 7, 1000});
    suite.movement({0, 1, 7});
    suite.p2p({1, 1000});
  }
  pg->barrier()->wait();
}

TEST(MpiBackend, RanksComeFromMpirun) {
  auto pg = world();
  try {
    ProcessGroup::create(nullptr, pg->rank() + 1, pg->size() + 5, {.backend = "mpi"});
    FAIL() << "a rank that mpirun did not give was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("mpirun started this process as rank"), std::string::npos)
        << e.what();
  }
}

TEST(MpiBackend, AsyncCollectivesOverlap) {
  auto pg = world();
  std::vector<std::vector<double>> bufs(8, std::vector<double>(5000, pg->rank() + 1.0));
  std::vector<std::shared_ptr<Work>> works;
  for (auto& b : bufs) works.push_back(pg->allreduce(TensorView::of(b)));
  for (auto& w : works) w->wait();
  const double want = pg->size() * (pg->size() + 1) / 2.0;
  for (auto& b : bufs)
    for (double v : b) ASSERT_EQ(v, want);
}

}  // namespace
}  // namespace dtrain::testing::backends
