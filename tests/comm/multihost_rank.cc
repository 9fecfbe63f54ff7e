// One rank of the multi-host tests (multihost_test.cc starts four of these in two network
// namespaces). Modes:
//   check    every all-reduce algorithm (hierarchical included), a broadcast and an all-gather
//            against the expected values; prints "OK rank R algo=<auto choice for 4 MiB>"
//   survive  all-reduces until one fails; prints "ERROR: <message>" and exits 3
//   steady   800 all-reduces of 1 MiB, each checked; prints "OK rank R"
// Each prints how its group split (NativeProcessGroup::hierarchy()) and the cost model's
// host link ("costs=<alpha>us/<GB/s>").
#include <chrono>
#include <cstdio>
#include <fmt/format.h>
#include <string>
#include <vector>

#include "comm/native_process_group.h"
#include "dtrain/dtrain.h"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "check";
  auto pg = dtrain::init_process_group();
  const int rank = pg->rank(), n = pg->size();
  auto* native = dynamic_cast<dtrain::comm::NativeProcessGroup*>(pg.get());
  if (native) {
    const auto& k = native->cost_model().constants();
    std::printf("%s\ncosts=%s\n", native->hierarchy().c_str(),
                fmt::format("{:.1f}us/{:.2f}GB/s", k.alpha * 1e6, 1e-9 / k.beta).c_str());
  }
  if (mode == "steady") {
    std::vector<float> v(1 << 18);
    for (int it = 0; it < 800; ++it) {
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((rank + it + i) % 7);
      pg->allreduce(dtrain::TensorView::of(v))->wait();
      for (size_t i = 0; i < v.size(); i += 997) {
        float want = 0;
        for (int r = 0; r < n; ++r) want += static_cast<float>((r + it + i) % 7);
        if (v[i] != want) {
          std::printf("WRONG rank %d iteration %d [%zu]: %f != %f\n", rank, it, i, v[i], want);
          return 1;
        }
      }
    }
    std::printf("OK rank %d\n", rank);
    pg->barrier()->wait();
    return 0;
  }
  if (mode == "check") {
    for (std::string algo : {"", "ring", "hierarchical", "halving_doubling"}) {
      for (size_t count : {size_t{1}, size_t{1001}, size_t{1} << 20}) {
        std::vector<float> v(count);
        for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>((rank + i) % 5);
        pg->allreduce(dtrain::TensorView::of(v), {.algorithm = algo})->wait();
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < n; ++r) want += static_cast<float>((r + i) % 5);
          if (v[i] != want) {
            std::printf("WRONG rank %d algo '%s' count %zu [%zu]: %f != %f\n", rank, algo.c_str(),
                        count, i, v[i], want);
            return 1;
          }
        }
      }
    }
    for (std::string algo : {"", "tree", "hierarchical"}) {
      for (int root : {0, 3}) {
        std::vector<int64_t> b(100003, rank == root ? 42 + root : 0);
        pg->broadcast(dtrain::TensorView::of(b), {.root = root, .algorithm = algo})->wait();
        if (b[0] != 42 + root || b[100002] != 42 + root) {
          std::printf("WRONG rank %d broadcast '%s' root %d\n", rank, algo.c_str(), root);
          return 1;
        }
      }
    }
    for (std::string algo : {"", "ring", "hierarchical"}) {
      std::vector<int32_t> in(1001, rank), out(1001 * n, -1);
      if (algo == "hierarchical" && native && !native->topology().uniform) {
        // Uneven parts: asking for it is an error on every rank, and nothing is sent.
        try {
          pg->allgather(dtrain::TensorView::of(out), dtrain::TensorView::of(in), {.algorithm = algo})->wait();
          std::printf("WRONG rank %d: hierarchical all-gather over uneven hosts ran\n", rank);
          return 1;
        } catch (const dtrain::InvalidArgumentError&) {
          continue;
        }
      }
      pg->allgather(dtrain::TensorView::of(out), dtrain::TensorView::of(in), {.algorithm = algo})->wait();
      for (int r = 0; r < n; ++r)
        if (out[1001 * r] != r || out[1001 * r + 1000] != r) {
          std::printf("WRONG rank %d allgather '%s' block %d\n", rank, algo.c_str(), r);
          return 1;
        }
    }
    std::printf("OK rank %d algo=%s\n", rank,
                native ? native->algorithm_for(dtrain::comm::CollectiveKind::kAllreduce, "", 4 << 20).c_str()
                       : "?");
    pg->barrier()->wait();
    return 0;
  }
  std::vector<float> v(1 << 20, 1.0f);
  std::printf("READY rank %d\n", rank);
  std::fflush(stdout);
  try {
    for (int i = 0; i < 100000; ++i) pg->allreduce(dtrain::TensorView::of(v))->wait();
  } catch (const std::exception& e) {
    std::printf("ERROR: %s\n", e.what());
    std::fflush(stdout);
    return 3;
  }
  return 0;
}
