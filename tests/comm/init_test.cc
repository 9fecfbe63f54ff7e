// init_process_group from the environment, as `dtrain run`, torchrun and mpirun leave it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "dtrain/dtrain.h"
#include "support/group.h"
#include "support/multiproc.h"

namespace dtrain::testing {
namespace {

TEST(Init, FromTorchrunEnvironment) {
  const int port = free_port();
  auto results = run_ranks(3, [&](int rank) {
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", "3", 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    ::unsetenv("DTRAIN_AGENT_STORE");
    auto pg = init_process_group();
    RANK_CHECK(pg->rank() == rank && pg->size() == 3, "identity {} of {}", pg->rank(), pg->size());
    std::vector<int32_t> v(1, rank * 10);
    if (rank == 0) {
      for (int r = 1; r < 3; ++r) {
        pg->recv(TensorView::of(v), r);
        RANK_CHECK(v[0] == r * 10, "from rank {} got {}", r, v[0]);
      }
    } else {
      pg->send(TensorView::of(v), 0);
    }
  });
  for (auto& r : results) EXPECT_TRUE(r.ok());
}

TEST(Init, FileStoreUrl) {
  const std::string path = ::testing::TempDir() + "/dtrain_init_file_store_" + std::to_string(::getpid());
  std::remove(path.c_str());
  auto results = run_ranks(2, [&](int rank) {
    InitOptions o;
    o.identity.rank = rank;
    o.identity.world_size = 2;
    o.identity.init_method = "file://" + path;
    o.group.advertise_addr = "127.0.0.1";
    auto pg = init_process_group(o);
    std::vector<float> v(2, 1.0f + rank);
    if (rank == 1) pg->send(TensorView::of(v), 0);
    else {
      pg->recv(TensorView::of(v), 1);
      RANK_CHECK(v[1] == 2.0f, "got {}", v[1]);
    }
  });
  for (auto& r : results) EXPECT_TRUE(r.ok());
  std::remove(path.c_str());
}

TEST(Init, WorldOfOneNeedsNothing) {
  auto results = run_ranks(1, [&](int) {
    for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
                          "SLURM_NTASKS", "JOB_COMPLETION_INDEX", "TF_CONFIG"})
      ::unsetenv(v);
    auto pg = init_process_group();
    RANK_CHECK(pg->size() == 1 && pg->rank() == 0, "{} of {}", pg->rank(), pg->size());
  });
  EXPECT_TRUE(results[0].ok());
}

}  // namespace
}  // namespace dtrain::testing
