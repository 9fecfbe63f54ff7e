// Every collective x every algorithm x world sizes 1..5 (and 8) x awkward counts x dtypes and
// ops, in real processes over loopback TCP, against references computed locally.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>
#include <vector>

#include "comm/algorithms/algorithm.h"
#include "common/reduce.h"
#include "dtrain/error.h"
#include "support/expect.h"
#include "support/group.h"
#include "support/multiproc.h"
#include "support/values.h"

namespace dtrain::testing {
namespace {

using namespace std::chrono_literals;

std::vector<std::byte> filled(DType t, size_t count, int rank) {
  std::vector<std::byte> b(count * element_size(t));
  for (size_t i = 0; i < count; ++i) put(b, t, i, small(rank, i));
  return b;
}

const DType kAllTypes[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI8,
                           DType::kU8,  DType::kI16, DType::kI32, DType::kI64};
const ReduceOp kFloatOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                              ReduceOp::kAvg};
const ReduceOp kIntOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kAvg, ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor};

void check_allreduce(ProcessGroup& pg, const std::string& algo) {
  const int n = pg.size(), rank = pg.rank();
  for (DType t : kAllTypes) {
    auto ops = is_float(t) ? std::span<const ReduceOp>(kFloatOps) : std::span<const ReduceOp>(kIntOps);
    for (ReduceOp op : ops)
      for (size_t count : counts_for(n)) {
        // The large count only for the main types: it is about bandwidth paths, not types.
        if (count > 1000 && !(t == DType::kF32 || t == DType::kBF16) ) continue;
        // Average too: the bandwidth algorithms divide it chunk by chunk as they go.
        if (count > 1000 && op != ReduceOp::kSum && op != ReduceOp::kMax && op != ReduceOp::kAvg)
          continue;
        auto buf = filled(t, count, rank);
        pg.allreduce(view(buf, t), {.op = op, .algorithm = algo})->wait();
        check_values(buf, t, count, [&](size_t i) { return expected_reduction(op, t, n, i); },
                      fmt::format("rank {}: all_reduce {} {} {} x{}", rank, algo, to_string(t),
                                  to_string(op), count));
      }
  }
}

// The algorithms of `kind` that ranks on one host run, from the registry: a new algorithm is
// tested by adding its file. `direct` only where every rank may read the others' memory (the
// default on one host, not over TCP); the hierarchical forms need several hosts (multihost_test
// runs them on emulated ones).
std::vector<std::string> one_host_algorithms(comm::CollectiveKind kind) {
  const char* transport = std::getenv("DTRAIN_TRANSPORT");
  const bool tcp = transport != nullptr && std::string(transport) == "tcp";
  std::vector<std::string> names;
  for (const comm::algo::Algorithm* a : comm::algo::algorithms_of(kind)) {
    if (a->needs == comm::algo::Needs::kParts || a->needs == comm::algo::Needs::kUniformParts)
      continue;
    if (a->needs == comm::algo::Needs::kReadAll && tcp) continue;
    names.emplace_back(a->name);
  }
  return names;
}

void check_others(ProcessGroup& pg) {
  const int n = pg.size(), rank = pg.rank();
  const DType t = DType::kF32;
  for (size_t count : counts_for(n)) {
    const std::string c = fmt::format("x{}", count);
    for (int root = 0; root < n; ++root) {
      for (const std::string& algo : one_host_algorithms(comm::CollectiveKind::kBroadcast)) {
        auto buf = filled(t, count, rank);
        pg.broadcast(view(buf, t), {.root = root, .algorithm = algo})->wait();
        check_values(buf, t, count, [&](size_t i) { return small(root, i); },
                      fmt::format("rank {}: broadcast {} root {} {}", rank, algo, root, c));
      }
      for (const std::string& algo : one_host_algorithms(comm::CollectiveKind::kReduce)) {
        auto buf = filled(t, count, rank);
        pg.reduce(view(buf, t), {.root = root, .op = ReduceOp::kSum, .algorithm = algo})->wait();
        if (rank == root)
          check_values(buf, t, count, [&](size_t i) { return expected_reduction(ReduceOp::kSum, t, n, i); },
                        fmt::format("rank {}: reduce {} root {} {}", rank, algo, root, c));
      }
      {
        auto in = filled(t, count, rank);
        std::vector<std::byte> out(rank == root ? in.size() * n : 0);
        pg.gather(view(out, t), view(in, t), {.root = root})->wait();
        if (rank == root)
          check_values(out, t, count * n, [&](size_t i) { return small(static_cast<int>(i / std::max<size_t>(count, 1)), i % std::max<size_t>(count, 1)); },
                        fmt::format("rank {}: gather root {} {}", rank, root, c));
      }
      {
        std::vector<std::byte> in(rank == root ? count * n * 4 : 0);
        for (size_t i = 0; rank == root && i < count * n; ++i) put(in, t, i, static_cast<double>(i % 1000));
        std::vector<std::byte> out(count * 4);
        pg.scatter(view(out, t), view(in, t), {.root = root})->wait();
        check_values(out, t, count, [&](size_t i) { return static_cast<double>((rank * count + i) % 1000); },
                      fmt::format("rank {}: scatter root {} {}", rank, root, c));
      }
    }
    for (const std::string& algo : one_host_algorithms(comm::CollectiveKind::kAllgather)) {
      auto in = filled(t, count, rank);
      std::vector<std::byte> out(in.size() * n);
      pg.allgather(view(out, t), view(in, t), {.algorithm = algo})->wait();
      check_values(out, t, count * n, [&](size_t i) { return small(static_cast<int>(i / std::max<size_t>(count, 1)), i % std::max<size_t>(count, 1)); },
                    fmt::format("rank {}: all_gather {} {}", rank, algo, c));
    }
    for (const std::string& algo : one_host_algorithms(comm::CollectiveKind::kReduceScatter)) {
      // reduce_scatter: block r of the sum (of the maximum); the input stays as it was.
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        auto in = filled(t, count * n, rank);
        const auto before = in;
        std::vector<std::byte> out(count * 4);
        pg.reduce_scatter(view(out, t), view(in, t), {.op = op, .algorithm = algo})->wait();
        check_values(out, t, count, [&](size_t i) { return expected_reduction(op, t, n, rank * count + i); },
                      fmt::format("rank {}: reduce_scatter {} {} {}", rank, algo, to_string(op), c));
        RANK_CHECK(in == before, "reduce_scatter {} changed its input", algo);
      }
      // In place: the output is this rank's block of the input (the hierarchical all-reduce's).
      auto in = filled(t, count * n, rank);
      TensorView mine = view(in, t);
      mine.data = in.data() + static_cast<size_t>(rank) * count * 4;
      mine.numel = count;
      pg.reduce_scatter(mine, view(in, t), {.op = ReduceOp::kSum, .algorithm = algo})->wait();
      std::vector<std::byte> block(in.begin() + rank * count * 4, in.begin() + (rank + 1) * count * 4);
      check_values(block, t, count, [&](size_t i) { return expected_reduction(ReduceOp::kSum, t, n, rank * count + i); },
                    fmt::format("rank {}: reduce_scatter {} in place {}", rank, algo, c));
    }
    {
      // all_to_all: block j of rank r holds 1000*r + j*count + i.
      std::vector<std::byte> in(count * n * 4), out(count * n * 4);
      for (size_t i = 0; i < count * n; ++i) put(in, t, i, static_cast<double>(1000 * rank + i % 997));
      pg.alltoall(view(out, t), view(in, t))->wait();
      check_values(out, t, count * n, [&](size_t i) {
        size_t from = i / std::max<size_t>(count, 1), k = i % std::max<size_t>(count, 1);
        return static_cast<double>(1000 * from + (rank * count + k) % 997);
      }, fmt::format("rank {}: all_to_all {}", rank, c));
    }
  }
  // v-forms: rank r contributes r+1 elements (rank 0 of a 1-world: 1).
  {
    std::vector<size_t> counts(n);
    size_t total = 0;
    for (int r = 0; r < n; ++r) total += counts[r] = static_cast<size_t>(r) + 1;
    auto in = filled(t, counts[rank], rank);
    std::vector<std::byte> out(total * 4);
    pg.allgatherv(view(out, t), view(in, t), counts)->wait();
    size_t off = 0;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < counts[r]; ++i)
        if (get(out, t, off + i) != small(r, i))
          throw std::runtime_error(fmt::format("rank {}: all_gather_v block {} [{}]", rank, r, i));
      off += counts[r];
    }
    // all_to_all_v: rank r sends (r + j) % 3 elements to rank j, value 100 r + j.
    std::vector<size_t> in_counts(n), out_counts(n);
    size_t in_total = 0, out_total = 0;
    for (int j = 0; j < n; ++j) {
      in_total += in_counts[j] = static_cast<size_t>((rank + j) % 3);
      out_total += out_counts[j] = static_cast<size_t>((j + rank) % 3);
    }
    std::vector<std::byte> vin(in_total * 4), vout(out_total * 4);
    size_t k = 0;
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < in_counts[j]; ++i) put(vin, t, k++, 100.0 * rank + j);
    pg.alltoallv(view(vout, t), out_counts, view(vin, t), in_counts)->wait();
    k = 0;
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < out_counts[j]; ++i)
        if (get(vout, t, k++) != 100.0 * j + rank)
          throw std::runtime_error(fmt::format("rank {}: all_to_all_v from {} [{}]", rank, j, i));
  }
  pg.barrier()->wait();
}

// Sums that round come out bit for bit the same on every rank and from call to call, whoever's
// thread did the adding (over TCP the pairs reduce what arrives as it arrives).
void check_repeatable(ProcessGroup& pg, const std::string& algo) {
  const size_t count = (size_t{1} << 20) + 3;
  std::vector<float> in(count), first(count), again(count), zeroth(count);
  for (size_t i = 0; i < count; ++i)
    in[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + pg.rank()) * 1e3 /
                               (pg.rank() + 1.7));
  for (auto* out : {&first, &again}) {
    *out = in;
    pg.allreduce(TensorView::of(*out), {.op = ReduceOp::kSum, .algorithm = algo})->wait();
  }
  RANK_CHECK(std::memcmp(first.data(), again.data(), count * sizeof(float)) == 0,
             "{}: two all-reduces of the same values differ", algo);
  zeroth = first;
  pg.broadcast(TensorView::of(zeroth), {.root = 0})->wait();
  RANK_CHECK(std::memcmp(first.data(), zeroth.data(), count * sizeof(float)) == 0,
             "{}: rank {}'s all-reduce differs from rank 0's", algo, pg.rank());
}

void run_world(int n) {
  const int port = free_port();
  expect_all_ok(run_ranks(n, [&](int rank) {
    auto pg = make_group(rank, n, port);
    for (const std::string& algo : one_host_algorithms(comm::CollectiveKind::kAllreduce))
      check_allreduce(*pg, algo);
    for (std::string algo : {"ring", "halving_doubling"}) check_repeatable(*pg, algo);
    check_others(*pg);
  }, 240s));
}

// The same over TCP only (the default puts ranks of one host on shared memory).
TEST(Collectives, WorldOf3OverTcp) {
  ::setenv("DTRAIN_TRANSPORT", "tcp", 1);
  run_world(3);
  ::unsetenv("DTRAIN_TRANSPORT");
}

// Five ranks: halving-doubling folds one rank in, then halves twice.
TEST(Collectives, WorldOf5OverTcp) {
  ::setenv("DTRAIN_TRANSPORT", "tcp", 1);
  run_world(5);
  ::unsetenv("DTRAIN_TRANSPORT");
}

TEST(Collectives, WorldOf1) { run_world(1); }
TEST(Collectives, WorldOf2) { run_world(2); }
TEST(Collectives, WorldOf3) { run_world(3); }
TEST(Collectives, WorldOf4) { run_world(4); }
TEST(Collectives, WorldOf5) { run_world(5); }

// `direct` where each rank reduces its own slice (the fallback where the ranks cannot share a
// counter page), and then calls that alternate between `direct` and other algorithms, so that
// the shared counter's start moves on correctly from call to call.
TEST(Collectives, DirectWithStaticSlicesAndAlternatingCalls) {
  for (const char* claims : {"0", "1"}) {
    const int port = free_port();
    expect_all_ok(run_ranks(3, [&](int rank) {
      ::setenv("DTRAIN_DIRECT_CLAIMS", claims, 1);
      auto pg = make_group(rank, 3, port);
      check_allreduce(*pg, "direct");
      for (size_t count : {size_t{0}, size_t{5}, (size_t{1} << 20) + 7, size_t{40000}}) {
        for (std::string algo : {"direct", "ring", "direct", "direct"}) {
          auto buf = filled(DType::kF32, count, rank);
          pg->allreduce(view(buf, DType::kF32), {.op = ReduceOp::kSum, .algorithm = algo})->wait();
          check_values(buf, DType::kF32, count,
                       [&](size_t i) { return expected_reduction(ReduceOp::kSum, DType::kF32, 3, i); },
                       fmt::format("rank {}: all_reduce {} x{} (claims {})", rank, algo, count, claims));
        }
      }
      // Sums that round: bit for bit those of adding the ranks' values in rank order, whoever
      // reduced which chunk (resumed training compares parameters bit for bit).
      auto value = [](int r, size_t i) {
        return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + r) * 1e3 / (r + 1.7));
      };
      const size_t count = (size_t{3} << 20) + 11;
      std::vector<float> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = value(rank, i);
      pg->allreduce(TensorView::of(v), {.op = ReduceOp::kSum, .algorithm = "direct"})->wait();
      for (size_t i = 0; i < count; ++i) {
        const float want = (value(0, i) + value(1, i)) + value(2, i);
        RANK_CHECK(std::memcmp(&v[i], &want, sizeof(float)) == 0,
                   "claims {}: element {} is {} instead of {} (rank-order sum)", claims, i, v[i], want);
      }
    }, 240s));
  }
}

TEST(Collectives, WorldOf8AllreduceAndBroadcast) {
  const int port = free_port();
  expect_all_ok(run_ranks(8, [&](int rank) {
    auto pg = make_group(rank, 8, port);
    for (std::string algo : {"ring", "halving_doubling", "recursive_doubling"}) {
      for (size_t count : {size_t{1}, size_t{1001}, size_t{1} << 18}) {
        auto buf = filled(DType::kF32, count, rank);
        pg->allreduce(view(buf, DType::kF32), {.algorithm = algo})->wait();
        check_values(buf, DType::kF32, count, [&](size_t i) { return expected_reduction(ReduceOp::kSum, DType::kF32, 8, i); },
                      fmt::format("rank {} all_reduce {} x{}", rank, algo, count));
      }
    }
    auto buf = filled(DType::kF32, 4099, rank);
    pg->broadcast(view(buf, DType::kF32), {.root = 5})->wait();
    check_values(buf, DType::kF32, 4099, [&](size_t i) { return small(5, i); }, "broadcast");
  }, 120s));
}

TEST(Collectives, OutOfPlaceAllreduceLeavesInputAlone) {
  const int port = free_port();
  expect_all_ok(run_ranks(3, [&](int rank) {
    auto pg = make_group(rank, 3, port);
    std::vector<int32_t> in(1000, rank + 1), out(1000, -7);
    pg->allreduce(TensorView::of(in), TensorView::of(out), {.op = ReduceOp::kProd})->wait();
    RANK_CHECK(out[999] == 6 && in[999] == rank + 1, "out {} in {}", out[999], in[999]);
  }));
}

// Issued back to back without waiting; waited in reverse order.
TEST(Collectives, AsyncBackToBack) {
  const int port = free_port();
  expect_all_ok(run_ranks(3, [&](int rank) {
    auto pg = make_group(rank, 3, port);
    std::vector<std::vector<std::byte>> bufs;
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 12; ++k) bufs.push_back(filled(DType::kF32, 1000 + k * 5000, rank + k));
    for (int k = 0; k < 12; ++k) works.push_back(pg->allreduce(view(bufs[k], DType::kF32)));
    for (int k = 11; k >= 0; --k) {
      works[k]->wait();
      check_values(bufs[k], DType::kF32, 1000 + k * 5000, [&](size_t i) {
        double s = 0;
        for (int r = 0; r < 3; ++r) s += small(r + k, i);
        return s;
      }, fmt::format("rank {} async #{}", rank, k));
    }
  }));
}

// async_op = false: the call returns finished; mixed with asynchronous ones it still runs
// after the group's earlier collectives, in call order on every rank.
TEST(Collectives, SynchronousCallsRunInOrderAfterAsynchronousOnes) {
  const int port = free_port();
  expect_all_ok(run_ranks(3, [&](int rank) {
    auto pg = make_group(rank, 3, port);
    for (int k = 0; k < 20; ++k) {
      std::vector<float> big(200000, static_cast<float>(rank + k)), small(16, 1.0f);
      auto pending = pg->allreduce(TensorView::of(big));
      AllreduceOptions now;
      now.async_op = false;
      auto done = pg->allreduce(TensorView::of(small), now);
      RANK_CHECK(done->is_completed(), "a synchronous all_reduce returned unfinished");
      RANK_CHECK(small[15] == 3.0f, "sync sum {} at step {}", small[15], k);
      pending->wait();
      RANK_CHECK(big[199999] == static_cast<float>(3 + 3 * k), "async sum {} at step {}",
                 big[199999], k);
      BarrierOptions b;
      b.async_op = false;
      pg->barrier(b)->wait();
    }
  }));
}

// Overlapping sub-groups used alternately with the world group.
TEST(Collectives, SubGroups) {
  const int port = free_port();
  expect_all_ok(run_ranks(5, [&](int rank) {
    auto world = make_group(rank, 5, port);
    auto even = world->new_group({0, 2, 4});
    auto odd_reversed = world->new_group({3, 1});
    auto middle = world->new_group({1, 2, 3});
    RANK_CHECK((even != nullptr) == (rank % 2 == 0), "membership of even");
    RANK_CHECK((odd_reversed != nullptr) == (rank % 2 == 1), "membership of odd");
    RANK_CHECK((middle != nullptr) == (rank >= 1 && rank <= 3), "membership of middle");
    if (odd_reversed) RANK_CHECK(odd_reversed->rank() == (rank == 3 ? 0 : 1), "rank order");
    for (int round = 0; round < 3; ++round) {
      std::vector<int64_t> v(100, rank + 1);
      if (even) {
        even->allreduce(TensorView::of(v))->wait();
        RANK_CHECK(v[99] == 1 + 3 + 5, "even sum {}", v[99]);
      }
      std::vector<int64_t> w(7, rank + 1);
      if (middle) {
        middle->allreduce(TensorView::of(w), {.op = ReduceOp::kMax})->wait();
        RANK_CHECK(w[0] == 4, "middle max {}", w[0]);
      }
      std::vector<int64_t> x(3, rank);
      world->allreduce(TensorView::of(x))->wait();
      RANK_CHECK(x[2] == 10, "world sum {}", x[2]);
      if (odd_reversed) {
        std::vector<int64_t> b(5, rank);
        odd_reversed->broadcast(TensorView::of(b), {.root = 0})->wait();
        RANK_CHECK(b[4] == 3, "odd broadcast from rank 3 gave {}", b[4]);
      }
    }
  }));
}

// A rank that calls another collective makes every rank fail with both calls named.
TEST(Collectives, MismatchFailsEveryRankWithNames) {
  struct Case {
    const char* name;
    std::function<void(ProcessGroup&, int)> call;
    const char* expect;
    int world = 3;
  };
  std::vector<Case> cases = {
      {"op", [](ProcessGroup& pg, int rank) {
         std::vector<float> v(4096, 1.0f);
         if (rank == 2) pg.allreduce(TensorView::of(v))->wait();
         else pg.broadcast(TensorView::of(v), {.root = 0})->wait();
       }, "called"},
      {"count", [](ProcessGroup& pg, int rank) {
         std::vector<float> v(rank == 1 ? 100 : 200, 1.0f);
         pg.allreduce(TensorView::of(v), {.algorithm = "ring"})->wait();
       }, "all_reduce(f32, 100, sum)"},
      {"dtype", [](ProcessGroup& pg, int rank) {
         std::vector<float> f(64, 1.0f);
         std::vector<int32_t> i(64, 1);
         if (rank == 0) pg.allreduce(TensorView::of(i))->wait();
         else pg.allreduce(TensorView::of(f))->wait();
       }, "all_reduce(i32, 64, sum)"},
      // Two ranks: the exchange of recursive doubling, whose steps take the peer's frame
      // straight out of the ring (Pair::try_recv_now) when the fingerprint is the one expected.
      {"dtype, one exchange", [](ProcessGroup& pg, int rank) {
         std::vector<float> f(64, 1.0f);
         std::vector<int32_t> i(64, 1);
         const AllreduceOptions o{.algorithm = "recursive_doubling", .async_op = false};
         if (rank == 0) pg.allreduce(TensorView::of(i), o)->wait();
         else pg.allreduce(TensorView::of(f), o)->wait();
       }, "all_reduce(i32, 64, sum)", 2},
      // The same with 8 bytes: the peer's frame waits whole in a mailbox slot, which the step
      // takes only when it is this receive's (RingStream::take_boxed).
      {"dtype, one exchange through a mailbox slot", [](ProcessGroup& pg, int rank) {
         std::vector<float> f(2, 1.0f);
         std::vector<int32_t> i(2, 1);
         const AllreduceOptions o{.algorithm = "recursive_doubling", .async_op = false};
         if (rank == 0) pg.allreduce(TensorView::of(i), o)->wait();
         else pg.allreduce(TensorView::of(f), o)->wait();
       }, "all_reduce(i32, 2, sum)", 2},
      {"root", [](ProcessGroup& pg, int rank) {
         std::vector<float> v(64, 1.0f);
         pg.reduce(TensorView::of(v), {.root = rank == 1 ? 1 : 0})->wait();
       }, "root"},
      // Both ranks the root: each only sends, so each is done before the other's message
      // arrives. The messages must not be left unread: both ranks would go on.
      {"every rank the root", [](ProcessGroup& pg, int rank) {
         std::vector<float> v(64, 1.0f);
         pg.broadcast(TensorView::of(v), {.root = rank})->wait();
       }, "broadcast(f32, 64, root", 2},
  };
  for (auto& c : cases) {
    const int port = free_port();
    auto results = run_ranks(c.world, [&](int rank) {
      auto pg = make_group(rank, c.world, port, {}, 3s);
      auto start = std::chrono::steady_clock::now();
      try {
        // Inside the try: a rank slow to leave this barrier may already hear of the failure of
        // the next collective from a rank that went ahead (the group has failed as a whole).
        pg->barrier()->wait();
        c.call(*pg, rank);
        // A rank whose part of the mismatched collective went through (a tree leaf that only
        // sends) hears of the failure by its next call; one that read the mismatched message
        // only during that call, by the call after.
        pg->barrier()->wait();
        pg->barrier()->wait();
        ::_exit(0);
      } catch (const Error& e) {
        auto took = std::chrono::steady_clock::now() - start;
        std::string m = e.what();
        RANK_CHECK(m.find(c.expect) != std::string::npos && m.find("#2") != std::string::npos,
                   "case {}: message lacks detail: {}", c.name, m);
        RANK_CHECK(took < 15s, "case {}: took {} ms", c.name,
                   std::chrono::duration_cast<std::chrono::milliseconds>(took).count());
        // Every rank called collective #2: none is said not to have arrived at it (beside its
        // own statement that it called it).
        RANK_CHECK(m.find("not arrived") == std::string::npos,
                   "case {}: the post-mortem contradicts itself: {}", c.name, m);
        std::fprintf(stderr, "case %s rank %d failed after %lld ms: %s\n", c.name, rank,
                     static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()), m.c_str());
        // Rank 0 hosts the store: it stays until the others have read their post-mortems (each
        // waits up to 3 s for the entries), as a launcher-hosted store would.
        if (rank == 0) std::this_thread::sleep_for(4500ms);
        ::_exit(3);
      }
      ::_exit(0);
    }, 60s);
    for (size_t r = 0; r < results.size(); ++r) {
      EXPECT_FALSE(results[r].timed_out) << c.name;
      EXPECT_EQ(results[r].exit_code, 3) << "case " << c.name << ": rank " << r
                                         << " did not fail with a named mismatch";
    }
  }
}

// Ranks that disagree on any one argument fail in the mismatched call itself, every one of them,
// long before the operation's timeout: no rank returns from it with data the others do not have,
// and none waits for a message nobody sends (a root mismatch in reduce or gather did, until the
// timeout). The arguments: root, op, dtype, count, and the split sizes of the v-forms.
TEST(Collectives, ADisagreementFailsTheCallItselfOnEveryRank) {
  struct Case {
    const char* name;
    std::function<void(ProcessGroup&, int)> call;
    int world = 3;
  };
  auto f = [](size_t n) { return std::vector<float>(n, 1.0f); };
  std::vector<Case> cases = {
      {"broadcast root", [&](ProcessGroup& pg, int rank) {
         auto v = f(64);
         pg.broadcast(TensorView::of(v), {.root = rank == 1 ? 1 : 0})->wait();
       }},
      {"broadcast root, large", [&](ProcessGroup& pg, int rank) {
         auto v = f(1 << 20);
         pg.broadcast(TensorView::of(v), {.root = rank == 2 ? 1 : 0})->wait();
       }, 4},
      {"broadcast, every rank the root", [&](ProcessGroup& pg, int rank) {
         auto v = f(64);
         pg.broadcast(TensorView::of(v), {.root = rank})->wait();
       }, 2},
      {"scatter root", [&](ProcessGroup& pg, int rank) {
         auto in = f(64 * pg.size()), out = f(64);
         pg.scatter(TensorView::of(out), TensorView::of(in), {.root = rank == 1 ? 1 : 0})->wait();
       }},
      {"reduce root", [&](ProcessGroup& pg, int rank) {
         auto v = f(64);
         pg.reduce(TensorView::of(v), {.root = rank == 1 ? 1 : 0})->wait();
       }},
      {"gather root", [&](ProcessGroup& pg, int rank) {
         auto in = f(64), out = f(64 * pg.size());
         pg.gather(TensorView::of(out), TensorView::of(in), {.root = rank == 1 ? 1 : 0})->wait();
       }},
      {"reduce op", [&](ProcessGroup& pg, int rank) {
         auto v = f(64);
         pg.reduce(TensorView::of(v), {.op = rank == 2 ? ReduceOp::kMax : ReduceOp::kSum})->wait();
       }},
      {"all_reduce op", [&](ProcessGroup& pg, int rank) {
         auto v = f(64);
         pg.allreduce(TensorView::of(v), {.op = rank == 1 ? ReduceOp::kMax : ReduceOp::kSum})->wait();
       }},
      // Two ranks, one exchange of recursive doubling: rank 1 comes late, so rank 0's frame
      // waits in its ring and the step takes it straight out of the ring (Pair::try_recv_now),
      // which must look at the fingerprint as a posted receive does.
      {"all_reduce dtype, one exchange", [&](ProcessGroup& pg, int rank) {
         std::vector<int32_t> i(64);
         auto v = f(64);
         const AllreduceOptions o{.algorithm = "recursive_doubling", .async_op = false};
         if (rank == 0) {
           pg.allreduce(TensorView::of(i), o)->wait();
         } else {
           std::this_thread::sleep_for(std::chrono::milliseconds(20));
           pg.allreduce(TensorView::of(v), o)->wait();
         }
       }, 2},
      {"broadcast count", [&](ProcessGroup& pg, int rank) {
         auto v = f(rank == 2 ? 32 : 64);
         pg.broadcast(TensorView::of(v))->wait();
       }},
      {"all_gather dtype", [&](ProcessGroup& pg, int rank) {
         std::vector<int32_t> i(64 * pg.size()), ii(64);
         auto o = f(64 * pg.size()), in = f(64);
         if (rank == 0) pg.allgather(TensorView::of(i), TensorView::of(ii))->wait();
         else pg.allgather(TensorView::of(o), TensorView::of(in))->wait();
       }},
      {"reduce_scatter count", [&](ProcessGroup& pg, int rank) {
         const size_t n = rank == 1 ? 16 : 64;
         auto in = f(n * pg.size()), out = f(n);
         pg.reduce_scatter(TensorView::of(out), TensorView::of(in))->wait();
       }},
      {"all_gather_v counts", [&](ProcessGroup& pg, int rank) {
         // Rank 1 believes rank 2 sends 8 elements, the others 16; each sends what it believes.
         std::vector<size_t> counts(pg.size(), 16);
         if (rank == 1) counts[2] = 8;
         auto in = f(counts[rank]), out = f(16 * pg.size());
         pg.allgatherv(TensorView::of(out), TensorView::of(in), counts)->wait();
       }},
      {"all_to_all_v split sizes", [&](ProcessGroup& pg, int rank) {
         // Rank 0 sends rank 2 eight elements; rank 2 expects four from it.
         std::vector<size_t> in_counts(pg.size(), 4), out_counts(pg.size(), 4);
         if (rank == 0) in_counts[2] = 8;
         auto in = f(4 * pg.size() + 4), out = f(4 * pg.size());
         pg.alltoallv(TensorView::of(out), out_counts, TensorView::of(in), in_counts)->wait();
       }},
  };
  for (auto& c : cases) {
    const int port = free_port();
    auto results = run_ranks(c.world, [&](int rank) {
      auto pg = make_group(rank, c.world, port, {}, 60s);
      pg->barrier()->wait();
      auto start = std::chrono::steady_clock::now();
      try {
        c.call(*pg, rank);
        std::fprintf(stderr, "case %s: rank %d returned from the mismatched call\n", c.name, rank);
        ::_exit(4);
      } catch (const Error& e) {
        auto took = std::chrono::steady_clock::now() - start;
        std::string m = e.what();
        RANK_CHECK(m.find("#2") != std::string::npos, "case {}: message lacks the call: {}", c.name, m);
        RANK_CHECK(took < 10s, "case {}: took {} ms against a 60 s limit", c.name,
                   std::chrono::duration_cast<std::chrono::milliseconds>(took).count());
        if (rank == 0) std::this_thread::sleep_for(4500ms);  // hosts the store for the post-mortems
        ::_exit(3);
      }
    }, 60s);
    for (size_t r = 0; r < results.size(); ++r) {
      EXPECT_FALSE(results[r].timed_out) << c.name;
      EXPECT_EQ(results[r].exit_code, 3) << "case " << c.name << ": rank " << r
                                         << " did not fail in the mismatched call";
    }
  }
}

TEST(Collectives, KilledPeerFailsTheOthers) {
  const int port = free_port();
  auto results = run_ranks(3, [&](int rank) {
    auto pg = make_group(rank, 3, port, {}, 60s);
    std::vector<float> v(size_t{16} << 20, 1.0f);
    pg->allreduce(TensorView::of(v))->wait();  // everyone is up
    if (rank == 2) {
      auto w = pg->allreduce(TensorView::of(v));
      std::this_thread::sleep_for(5ms);
      ::raise(SIGKILL);
    }
    auto start = std::chrono::steady_clock::now();
    try {
      pg->allreduce(TensorView::of(v))->wait();
      RANK_CHECK(false, "all_reduce with a dead rank succeeded");
    } catch (const Error& e) {
      std::string m = e.what();
      auto took = std::chrono::steady_clock::now() - start;
      RANK_CHECK(m.find("rank 2") != std::string::npos && m.find("collective #2") != std::string::npos,
                 "message lacks detail: {}", m);
      // Fast (well under the post-mortem's 3 s wait): it does not wait for a rank whose
      // connection broke.
      RANK_CHECK(took < 2s, "took {} ms: {}",
                 std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), m);
    }
    // The group is unusable afterwards, and says why.
    try {
      pg->barrier()->wait();
      RANK_CHECK(false, "barrier after the failure succeeded");
    } catch (const Error& e) {
      RANK_CHECK(std::string(e.what()).find("since collective #2 failed") != std::string::npos ||
                     std::string(e.what()).find("rank 2") != std::string::npos, "{}", e.what());
    }
    ::_exit(3);
  }, 60s);
  EXPECT_EQ(results[2].signal, SIGKILL);
  EXPECT_EQ(results[0].exit_code, 3);
  EXPECT_EQ(results[1].exit_code, 3);
}

TEST(Collectives, TimeoutNamesTheCollective) {
  const int port = free_port();
  expect_all_ok(run_ranks(2, [&](int rank) {
    auto pg = make_group(rank, 2, port);
    std::vector<float> v(10, 1.0f);
    if (rank == 0) {
      try {
        pg->allreduce(TensorView::of(v), {.timeout = 300ms})->wait();
        RANK_CHECK(false, "all_reduce without a partner succeeded");
      } catch (const TimeoutError& e) {
        std::string m = e.what();
        RANK_CHECK(m.find("collective #1") != std::string::npos && m.find("all_reduce(f32, 10, sum)") != std::string::npos &&
                       m.find("limit") != std::string::npos,
                   "message lacks detail: {}", m);
      }
    }
    // Rank 1 never called it, yet hears of it: the failed group is unusable on every rank.
    if (rank == 1) {
      std::vector<int8_t> done(1);
      try {
        pg->recv(TensorView::of(done), 0, 99, {.timeout = 20s});
        RANK_CHECK(false, "recv in a failed group succeeded");
      } catch (const PeerFailureError& e) {
        RANK_CHECK(std::string(e.what()).find("collective #1") != std::string::npos, "{}", e.what());
      }
    }
  }));
}

// A rank waiting on one peer hears of the group's failure from another, on a pair it is not
// receiving on: over shared memory such a pair's ring asks for no doorbell, and the report must
// wake the rank anyway (the peer it waits on may never send, nor report).
TEST(Collectives, AFailureReportWakesARankWaitingOnAnotherPeer) {
  const int port = free_port();
  expect_all_ok(run_ranks(3, [&](int rank) {
    auto pg = make_group(rank, 3, port);
    pg->barrier()->wait();
    std::vector<int8_t> byte(1);
    if (rank == 1) {
      std::vector<float> v(10, 1.0f);
      try {
        pg->allreduce(TensorView::of(v), {.timeout = 500ms})->wait();
        RANK_CHECK(false, "all_reduce without partners succeeded");
      } catch (const TimeoutError&) {
      }
    } else if (rank == 0) {
      const auto start = std::chrono::steady_clock::now();
      try {
        pg->recv(TensorView::of(byte), 2, 7, {.timeout = 20s});  // rank 2 never sends
        RANK_CHECK(false, "recv in a failed group succeeded");
      } catch (const PeerFailureError& e) {
        const auto took = std::chrono::steady_clock::now() - start;
        RANK_CHECK(std::string(e.what()).find("rank 1") != std::string::npos, "{}", e.what());
        // Rank 1 fails after 0.5 s; it then waits up to 3 s for the others' post-mortem
        // entries, so a report noticed only when rank 1 moved again would come late.
        RANK_CHECK(took < 2s, "heard of rank 1's failure after {} ms",
                   std::chrono::duration_cast<std::chrono::milliseconds>(took).count());
      }
    } else {
      std::this_thread::sleep_for(3s);  // neither sends to rank 0 nor fails itself meanwhile
    }
  }));
}

// A rank that hears of a peer's failure before its own call writes its flight record at that
// call, which cannot start: `dtrain doctor` puts what it was calling beside the others'.
TEST(Collectives, ACollectiveThatCannotStartWritesTheFlightRecord) {
  const int port = free_port();
  const std::string dir =
      ::testing::TempDir() + "/dtrain_cannot_start_" + std::to_string(::getpid());
  expect_all_ok(run_ranks(2, [&](int rank) {
    ::setenv("DTRAIN_FLIGHT_DIR", (dir + "/" + std::to_string(rank)).c_str(), 1);
    auto pg = make_group(rank, 2, port);
    std::vector<float> v(10, 1.0f);
    if (rank == 0) {
      try {
        pg->allreduce(TensorView::of(v), {.timeout = 300ms})->wait();
      } catch (const TimeoutError&) {
      }
      std::this_thread::sleep_for(2s);  // the store and the connection stay up for rank 1
      return;
    }
    std::this_thread::sleep_for(1s);  // rank 0's report has come by now
    try {
      pg->barrier()->wait();
      RANK_CHECK(false, "a collective of a failed group started");
    } catch (const PeerFailureError& e) {
      const std::string m = e.what();
      RANK_CHECK(m.find("cannot start") != std::string::npos &&
                     m.find("Flight record: " + dir + "/1/") != std::string::npos,
                 "{}", m);
      std::ifstream record(dir + "/1/rank1.json");
      const std::string text((std::istreambuf_iterator<char>(record)),
                             std::istreambuf_iterator<char>());
      RANK_CHECK(text.find("barrier") != std::string::npos, "the record lacks the call: {}", text);
    }
  }));
  std::filesystem::remove_all(dir);
}

TEST(Collectives, BadArgumentsAreRejectedAtTheCall) {
  const int port = free_port();
  expect_all_ok(run_ranks(1, [&](int rank) {
    auto pg = make_group(rank, 1, port);
    std::vector<float> v(8), out(3);
    auto expect_invalid = [&](auto fn, const char* needle) {
      try {
        fn();
        RANK_CHECK(false, "accepted: {}", needle);
      } catch (const InvalidArgumentError& e) {
        RANK_CHECK(std::string(e.what()).find(needle) != std::string::npos, "{}", e.what());
      }
    };
    expect_invalid([&] { pg->broadcast(TensorView::of(v), {.root = 4}); }, "root 4");
    expect_invalid([&] { pg->allgather(TensorView::of(out), TensorView::of(v)); }, "needs size()");
    expect_invalid([&] { pg->allreduce(TensorView::of(v), {.op = ReduceOp::kBand}); }, "integer");
    expect_invalid([&] { pg->allreduce(TensorView::of(v), {.algorithm = "magic"}); }, "halving_doubling");
    expect_invalid([&] { pg->new_group({0, 0}); }, "twice");
  }));
}

}  // namespace
}  // namespace dtrain::testing

namespace dtrain::testing {
namespace {

// A collective that waits past DTRAIN_STRAGGLER_SECONDS is reported, and again every interval, by
// the lowest waiting rank only: who has arrived and who has not, against the limit.
TEST(Collectives, StragglerIsNamedInTheLog) {
  const int port = free_port();
  const std::string log = ::testing::TempDir() + "/dtrain_straggler_" + std::to_string(::getpid());
  auto results = run_ranks(3, [&](int rank) {
    ::setenv("DTRAIN_STRAGGLER_SECONDS", "1", 1);
    if (rank < 2) {
      FILE* f = std::freopen((log + std::to_string(rank)).c_str(), "w", stderr);
      RANK_CHECK(f != nullptr, "cannot redirect stderr");
    }
    auto pg = make_group(rank, 3, port);
    pg->barrier()->wait();
    if (rank == 2) std::this_thread::sleep_for(3500ms);
    std::vector<float> v(16, 1.0f);
    pg->allreduce(TensorView::of(v))->wait();
    RANK_CHECK(v[0] == 3.0f, "sum {}", v[0]);
    std::fflush(stderr);
  }, 60s);
  expect_all_ok(results);
  auto read = [&](int rank) {
    std::ifstream in(log + std::to_string(rank));
    std::stringstream ss;
    ss << in.rdbuf();
    std::remove((log + std::to_string(rank)).c_str());
    return ss.str();
  };
  const std::string text = read(0), rank1 = read(1);
  const std::string report = "rank 0: collective #2 of group world, all_reduce(f32, 16, sum), has waited";
  EXPECT_NE(text.find(report), std::string::npos) << text;
  EXPECT_NE(text.find("s of its 30 s limit: arrived: rank 0 at"), std::string::npos) << text;
  EXPECT_NE(text.find("not arrived: rank 2"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1 at"), std::string::npos) << text;
  EXPECT_NE(text.find(report, text.find(report) + 1), std::string::npos)
      << "reported once, not every interval: " << text;
  // At the threshold and its multiples (1, 2, 3 s), not drifting by the watchdog's wake-ups.
  std::vector<double> waits;
  for (size_t at = text.find(report); at != std::string::npos; at = text.find(report, at + 1))
    waits.push_back(std::stod(text.substr(at + report.size())));
  ASSERT_GE(waits.size(), 2u) << text;
  for (size_t i = 0; i < waits.size(); ++i)
    EXPECT_NEAR(waits[i], 1.0 * static_cast<double>(i + 1), 0.2) << "report " << i << ": " << text;
  EXPECT_EQ(rank1.find("has waited"), std::string::npos) << "rank 1 reported too: " << rank1;
}

// A collective past its limit is failing: its error is the report, and no progress line follows
// it saying the call "has waited 3.1 s of its 2 s limit".
TEST(Collectives, NoProgressReportPastTheLimit) {
  const int port = free_port();
  const std::string log = ::testing::TempDir() + "/dtrain_past_limit_" + std::to_string(::getpid());
  auto results = run_ranks(2, [&](int rank) {
    ::setenv("DTRAIN_STRAGGLER_SECONDS", "1", 1);
    if (rank == 0) {
      FILE* f = std::freopen(log.c_str(), "w", stderr);
      RANK_CHECK(f != nullptr, "cannot redirect stderr");
    }
    auto pg = make_group(rank, 2, port);
    pg->barrier()->wait();
    std::vector<float> v(4, 1.0f);
    if (rank == 0) {
      try {
        pg->allreduce(TensorView::of(v), {.timeout = 2s})->wait();
        RANK_CHECK(false, "all_reduce without a partner succeeded");
      } catch (const TimeoutError&) {
      }
      std::this_thread::sleep_for(1500ms);  // a report would have come by now
      std::fflush(stderr);
    } else {
      std::this_thread::sleep_for(6s);  // never calls it
    }
  }, 60s);
  expect_all_ok(results);
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  std::remove(log.c_str());
  const std::string text = ss.str();
  const std::string report = "has waited ";
  ASSERT_NE(text.find(report), std::string::npos) << "no report within the limit: " << text;
  for (size_t at = text.find(report); at != std::string::npos; at = text.find(report, at + 1))
    EXPECT_LT(std::stod(text.substr(at + report.size())), 2.0) << text;
}

// Over TCP a stopped rank (SIGSTOP: alive, its connections open, silent) is named as one that
// did not answer within the limit, not as one whose connection broke, even when it stopped in
// the middle of a message (the connection is then closed here, by the timeout). The store is
// the test's, so that it outlives the ranks; the last of ranks 0 and 1 to fail kills rank 2.
TEST(Collectives, AStoppedRankIsNamedAsSilentNotAsGone) {
  TcpStoreServer server({.host = "127.0.0.1", .port = 0});
  const std::string pid_file =
      ::testing::TempDir() + "/dtrain_stopped_" + std::to_string(::getpid());
  auto results = run_ranks(3, [&](int rank) {
    TcpStoreOptions so;
    so.host = "127.0.0.1";
    so.port = server.port();
    so.rank = rank;
    auto store = std::make_shared<TcpStore>(so);
    ProcessGroupOptions o;
    o.transport = "tcp";
    o.timeout = 1500ms;
    auto pg = ProcessGroup::create(store, rank, 3, o);
    std::vector<float> v(1 << 22, 1.0f);  // 16 MiB: rank 2 stops in the middle of it
    if (rank == 2) {
      std::ofstream(pid_file) << ::getpid() << "\n";
      pg->barrier()->wait();
      std::thread stop([] {
        std::this_thread::sleep_for(20ms);
        ::raise(SIGSTOP);
      });
      try {
        for (int i = 0; i < 50; ++i) pg->allreduce(TensorView::of(v))->wait();
      } catch (const Error&) {
      }
      stop.join();
      ::_exit(4);
    }
    pg->barrier()->wait();
    std::string text;  // empty when this rank got all it needed before rank 2 stopped
    try {
      // Long enough (50 all-reduces) that rank 2 stops in the middle of one.
      for (int i = 0; i < 50; ++i) pg->allreduce(TensorView::of(v))->wait();
    } catch (const Error& e) {
      text = e.what();
    }
    if (store->add("done", 1) == 2) {  // the last of ranks 0 and 1 lets rank 2 go
      pid_t stopped = 0;
      std::ifstream(pid_file) >> stopped;
      if (stopped > 0) ::kill(stopped, SIGKILL);
    }
    if (text.empty()) ::_exit(5);
    RANK_CHECK(text.find("rank 2: gone") == std::string::npos, "called gone: {}", text);
    RANK_CHECK(text.find("rank 2: no word within") != std::string::npos ||
                   text.find("rank 2: did not answer within the limit") != std::string::npos,
               "not named as silent: {}", text);
    ::_exit(3);
  }, 60s);
  // A rank whose receives from rank 2 were all done before it stopped may finish (5); the
  // others wait for it and fail (3), naming it as silent.
  for (int r : {0, 1}) EXPECT_TRUE(results[r].exit_code == 3 || results[r].exit_code == 5) << r;
  EXPECT_TRUE(results[0].exit_code == 3 || results[1].exit_code == 3) << "nobody waited for rank 2";
  EXPECT_EQ(results[2].signal, SIGKILL);
  std::remove(pid_file.c_str());
}

}  // namespace
}  // namespace dtrain::testing
