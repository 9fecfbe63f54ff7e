// p2p_demo: point-to-point messages between the ranks of a dtrain job.
//
//   build/bin/dtrain run -n 2 -- build/bin/p2p_demo
//
// Every rank finds the others through the store named by MASTER_ADDR/MASTER_PORT (set by
// `dtrain run`). Then:
//   1. a token goes around the ring 0 -> 1 -> ... -> 0, each rank adding its rank to it;
//   2. ranks 0 and 1 play ping-pong at sizes from 4 B to 64 MiB, checking every byte, and rank 0
//      prints the round-trip time and bandwidth of each size;
//   3. rank 0 prints "p2p_demo: OK" (any error exits non-zero, and `dtrain run` stops the job).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <vector>

#include "dtrain/dtrain.h"

namespace {

using Clock = std::chrono::steady_clock;

void fill(std::vector<uint8_t>& v, uint8_t seed) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 31 + seed);
}

size_t count_wrong(const std::vector<uint8_t>& v, uint8_t seed) {
  size_t wrong = 0;
  for (size_t i = 0; i < v.size(); ++i) wrong += v[i] != static_cast<uint8_t>(i * 31 + seed);
  return wrong;
}

}  // namespace

int main() try {
  auto pg = dtrain::init_process_group();
  const int rank = pg->rank();
  const int size = pg->size();
  std::printf("rank %d of %d ready\n", rank, size);

  if (size < 2) {
    std::printf("p2p_demo needs at least 2 ranks: run it with `dtrain run -n 2 -- %s`\n",
                "build/bin/p2p_demo");
    return 1;
  }

  // 1. The ring.
  std::vector<int64_t> token(1, 0);
  auto view = dtrain::TensorView::of(token);
  if (rank == 0) {
    token[0] = 0;
    pg->send(view, 1);
    pg->recv(view, size - 1);
    const int64_t expected = int64_t{size} * (size - 1) / 2;
    std::printf("ring: token came back as %lld (expected %lld)\n",
                static_cast<long long>(token[0]), static_cast<long long>(expected));
    if (token[0] != expected) return 1;
  } else {
    pg->recv(view, rank - 1);
    token[0] += rank;
    pg->send(view, (rank + 1) % size);
  }

  // 2. Ping-pong between ranks 0 and 1.
  if (rank <= 1) {
    const int peer = 1 - rank;
    if (rank == 0) std::printf("%12s %8s %14s %12s %8s\n", "bytes", "iters", "round trip us", "GB/s", "#wrong");
    for (size_t bytes = 4; bytes <= (size_t{64} << 20); bytes *= 8) {
      const int iters = bytes <= (1 << 16) ? 200 : bytes <= (4 << 20) ? 20 : 4;
      std::vector<uint8_t> out(bytes), in(bytes);
      fill(out, static_cast<uint8_t>(rank));
      size_t wrong = 0;
      auto start = Clock::now();
      for (int i = 0; i < iters; ++i) {
        if (rank == 0) {
          pg->send(dtrain::TensorView::of(out), peer, 1);
          pg->recv(dtrain::TensorView::of(in), peer, 1);
        } else {
          pg->recv(dtrain::TensorView::of(in), peer, 1);
          pg->send(dtrain::TensorView::of(out), peer, 1);
        }
      }
      double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iters;
      wrong = count_wrong(in, static_cast<uint8_t>(peer));
      if (rank == 0)
        std::printf("%12zu %8d %14.1f %12.3f %8zu\n", bytes, iters, us, 2.0 * bytes / us / 1e3, wrong);
      if (wrong != 0) return 1;
    }
  }

  // Nobody leaves before everyone is done: rank 0 collects a "done" from each rank.
  std::vector<uint8_t> done(1, 1);
  if (rank == 0) {
    for (int r = 1; r < size; ++r) pg->recv(dtrain::TensorView::of(done), r, 2);
    std::printf("p2p_demo: OK\n");
  } else {
    pg->send(dtrain::TensorView::of(done), 0, 2);
  }
  return 0;
} catch (const std::exception& e) {  // dtrain errors say who, what and how long
  std::fprintf(stderr, "p2p_demo: %s\n", e.what());
  return 1;
}
