// PerDeviceGroup (what DTRAIN_BACKEND=nccl makes): host tensors go through the host group, on
// real ranks over real sockets. Here both sides are native groups of their own names, so that
// the errors say which one a call reached; the CUDA side's own path runs on a GPU only
// (nccl_backend_test: HostTensorsGoThroughTheNativeGroupBesideIt).
#include "comm/per_device_group.h"

#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

#include "dtrain/error.h"
#include "dtrain/store.h"
#include "support/expect.h"
#include "support/group.h"
#include "support/multiproc.h"

namespace dtrain::testing {
namespace {

using namespace std::chrono_literals;

// The two sides, over one store: "gpu-side" stands where the nccl group would be.
std::shared_ptr<comm::PerDeviceGroup> make_pair_of_groups(int rank, int port) {
  TcpStoreOptions so;
  so.host = "127.0.0.1";
  so.port = static_cast<uint16_t>(port);
  so.is_server = rank == 0;
  so.timeout = 30s;
  so.connect_timeout = 20s;
  so.rank = rank;
  auto store = std::make_shared<TcpStore>(so);
  const ProcessGroupOptions base{.timeout = 30s, .connect_timeout = 20s};
  ProcessGroupOptions gpu = base, host = base;
  gpu.name = "gpu-side";
  host.name = "host-side";
  return std::make_shared<comm::PerDeviceGroup>(ProcessGroup::create(store, rank, 2, gpu),
                                                ProcessGroup::create(store, rank, 2, host));
}

TEST(PerDeviceGroup, HostTensorsGoThroughTheHostGroup) {
  const int port = free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    const std::shared_ptr<ProcessGroup> pg = make_pair_of_groups(rank, port);
    RANK_CHECK(pg->rank() == rank && pg->size() == 2 && pg->name() == "gpu-side", "identity");

    std::vector<float> x = {1.0f + rank, 10.0f * (rank + 1)};
    pg->allreduce(TensorView::of(x))->wait();
    RANK_CHECK((x == std::vector<float>{3, 30}), "all_reduce: {} {}", x[0], x[1]);
    std::vector<int64_t> mine = {rank}, all(2, -1);
    pg->allgather(TensorView::of(all), TensorView::of(mine))->wait();
    RANK_CHECK((all == std::vector<int64_t>{0, 1}), "all_gather");
    std::vector<double> b = {rank == 1 ? 7.0 : 0.0};
    pg->broadcast(TensorView::of(b), {.root = 1})->wait();
    RANK_CHECK(b[0] == 7.0, "broadcast: {}", b[0]);
    std::vector<int32_t> in = {rank * 10, rank * 10 + 1}, out(2);
    pg->alltoall(TensorView::of(out), TensorView::of(in))->wait();
    RANK_CHECK((out == std::vector<int32_t>{rank, 10 + rank}), "all_to_all");
    std::vector<float> msg(3, rank == 0 ? 5.0f : 0.0f);
    if (rank == 0) pg->send(TensorView::of(msg), 1);
    if (rank == 1) pg->recv(TensorView::of(msg), 0);
    RANK_CHECK(msg == std::vector<float>(3, 5.0f), "send/recv");
    // A non-root's output holds no memory: it does not count.
    std::vector<float> one = {static_cast<float>(rank)}, gathered(rank == 0 ? 2 : 0);
    pg->gather(rank == 0 ? TensorView::of(gathered) : TensorView{}, TensorView::of(one))->wait();
    if (rank == 0) RANK_CHECK((gathered == std::vector<float>{0, 1}), "gather");
    pg->barrier({})->wait();

    // Sub-groups pair the two sides' sub-groups: ranks reversed.
    auto sub = pg->new_group({1, 0});
    RANK_CHECK(sub != nullptr && sub->rank() == 1 - rank, "new_group");
    std::vector<float> s = {static_cast<float>(sub->rank())};
    sub->allreduce(TensorView::of(s))->wait();
    RANK_CHECK(s[0] == 1.0f, "the sub-group's all_reduce: {}", s[0]);

    // One side or the other in a call, refused before anything moves (the CUDA view's pointer
    // is never read).
    TensorView on_gpu{reinterpret_cast<void*>(uintptr_t{0x1000}), 2, DType::kI64, Device::kCuda,
                      0};
    try {
      pg->allgather(TensorView::of(all), on_gpu);
      RANK_CHECK(false, "a host output beside a CUDA input was taken");
    } catch (const InvalidArgumentError& e) {
      const std::string text = e.what();
      RANK_CHECK(text.find(fmt::format("rank {}: all_gather of group gpu-side: one tensor is on "
                                       "the host, another on cuda:0",
                                       rank)) != std::string::npos,
                 "{}", text);
      RANK_CHECK(text.find("pass the call's tensors on one device") != std::string::npos, "{}",
                 text);
    }

    // Which group a host call reached: the one its timeout names (rank 1 does not call).
    pg->barrier({})->wait();
    if (rank == 0) {
      std::vector<float> alone(4);
      try {
        pg->broadcast(TensorView::of(alone), {.timeout = 300ms})->wait();
        RANK_CHECK(false, "a broadcast only rank 0 made completed");
      } catch (const TimeoutError& e) {
        const std::string text = e.what();
        RANK_CHECK(text.find("of group host-side") != std::string::npos, "{}", text);
      }
    } else {
      std::this_thread::sleep_for(1s);  // alive until rank 0 timed out: no peer-closed error
    }
  }));
}

TEST(PerDeviceGroup, AbortEndsBothSides) {
  const int port = free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    auto pg = make_pair_of_groups(rank, port);
    pg->abort("the job is stopping");
    for (auto* side : {&pg->host_group(), &pg->cuda_group()}) {
      std::vector<float> x(2);
      try {
        side->allreduce(TensorView::of(x))->wait();
        RANK_CHECK(false, "{} went on after the abort", side->name());
      } catch (const Error& e) {
        const std::string text = e.what();
        RANK_CHECK(text.find(fmt::format("group {} was aborted: the job is stopping",
                                         side->name())) != std::string::npos,
                   "{}", text);
      }
    }
  }));
}

}  // namespace
}  // namespace dtrain::testing
