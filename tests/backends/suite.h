// A compact collectives correctness suite run against any backend: every collective and
// send/recv, a few dtypes and ops, counts 0, 1, a prime and a few MiB, a sub-group, and the
// combinations a backend refuses (which must fail with "backend X does not support Y on Z").
// Each outcome is recorded as (backend, op, device, dtype, supported) in
// build/backend_support/<backend>.jsonl, from which tools/backends_table.py writes
// docs/backends.md: the table is what these tests exercised, never typed by hand.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/reduce.h"
#include "dtrain/error.h"
#include "dtrain/process_group.h"
#include "support/group.h"
#include "support/values.h"

namespace dtrain::testing::backends {

inline std::string support_dir() { return std::string(DTRAIN_BIN_DIR) + "/../backend_support"; }

// Appends one outcome (O_APPEND: ranks and processes may write at once; lines stay whole).
inline void record(const std::string& backend, const std::string& op, const std::string& device,
                   const std::string& dtype, bool supported) {
  ::mkdir(support_dir().c_str(), 0755);
  const std::string path = fmt::format("{}/{}.jsonl", support_dir(), backend);
  const std::string line =
      fmt::format(R"({{"backend": "{}", "op": "{}", "device": "{}", "dtype": "{}", "supported": {}}})"
                  "\n", backend, op, device, dtype, supported ? "true" : "false");
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  [[maybe_unused]] auto n = ::write(fd, line.data(), line.size());
  ::close(fd);
}

// Which reductions each backend can do (data movement works for every dtype everywhere).
inline bool reduces(const std::string& backend, DType t) {
  if (backend == "gloo") return t != DType::kBF16;
  if (backend == "mpi") return t != DType::kBF16 && t != DType::kF16;
  return true;
}

// Which reduction ops each backend has: NCCL has no bitwise ones.
inline bool has_op(const std::string& backend, ReduceOp op) {
  return backend != "nccl" || (op != ReduceOp::kBand && op != ReduceOp::kBor && op != ReduceOp::kBxor);
}

// Runs f, which must throw InvalidArgumentError with "backend <backend> does not support".
inline void expect_unsupported(const std::string& backend, const std::string& what,
                               const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgumentError& e) {
    const std::string text = e.what();
    RANK_CHECK(text.find(fmt::format("backend {} does not support", backend)) != std::string::npos,
               "{}: the error does not say what backend {} does not support: {}", what, backend, text);
    return;
  }
  throw std::runtime_error(fmt::format("{} should have failed with backend {}", what, backend));
}

inline std::vector<std::byte> filled(DType t, size_t count, const std::function<double(size_t)>& v) {
  std::vector<std::byte> b(count * element_size(t));
  for (size_t i = 0; i < count; ++i) put(b, t, i, v(i));
  return b;
}

struct Suite {
  ProcessGroup& pg;
  std::string backend;
  bool record_results;  // one rank of one run records, to keep the files short
  // Where the group sees the suite's tensors: "cuda" when a test adapter (nccl_backend_test.cc)
  // hands it GPU copies of them; the outcomes noted "cpu" below are recorded under it.
  std::string tensors = "cpu";

  int rank() const { return pg.rank(); }
  int n() const { return pg.size(); }
  void note(const std::string& op, const std::string& device, const std::string& dtype, bool ok) {
    if (record_results) record(backend, op, device == "cpu" ? tensors : device, dtype, ok);
  }

  void reductions(const std::vector<size_t>& counts) {
    if (backend != "native") {  // int8 on the wire is the native backend's own algorithm
      std::vector<float> v(8, 1.0f);
      expect_unsupported(backend, "all_reduce with int8 on the wire",
                         [&] { pg.allreduce(TensorView::of(v), {.wire = Wire::kInt8}); });
    }
    const DType types[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI32, DType::kI64, DType::kU8};
    for (DType t : types) {
      std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg};
      if (t == DType::kF32 || t == DType::kI32) ops = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg};
      if (t == DType::kI32 || t == DType::kU8) ops.insert(ops.end(), {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor});
      const std::string dt(to_string(t));
      for (ReduceOp op : ops) {
        for (size_t count : counts) {
          if (count > 4096 && (t != DType::kF32 || op != ReduceOp::kSum)) continue;  // MiB: f32 sum only
          const std::string what = fmt::format("all_reduce {} {} x {}", to_string(op), dt, count);
          auto buf = filled(t, count, [&](size_t i) { return small(rank(), i); });
          if (!has_op(backend, op)) {
            expect_unsupported(backend, what, [&] { pg.allreduce(view(buf, t), {.op = op}); });
            continue;
          }
          if (!reduces(backend, t)) {
            expect_unsupported(backend, what, [&] { pg.allreduce(view(buf, t), {.op = op}); });
            expect_unsupported(backend, what, [&] { pg.reduce(view(buf, t), {.op = op}); });
            std::vector<std::byte> out(buf.size() / std::max(1, n()));
            if (count % n() == 0)
              expect_unsupported(backend, what, [&] { pg.reduce_scatter(view(out, t), view(buf, t), {.op = op}); });
            continue;
          }
          pg.allreduce(view(buf, t), {.op = op})->wait();
          check_values(buf, t, count, [&](size_t i) { return expected_reduction(op, t, n(), i); }, what);
          // reduce to the last rank
          auto red = filled(t, count, [&](size_t i) { return small(rank(), i); });
          pg.reduce(view(red, t), {.root = n() - 1, .op = op})->wait();
          if (rank() == n() - 1)
            check_values(red, t, count, [&](size_t i) { return expected_reduction(op, t, n(), i); }, "reduce " + what);
        }
        if (op == ReduceOp::kSum || op == ReduceOp::kAvg) {
          // reduce_scatter: blocks of 5 elements per rank
          const size_t block = 5;
          auto in = filled(t, block * n(), [&](size_t i) { return small(rank(), i); });
          std::vector<std::byte> out(block * element_size(t));
          if (!reduces(backend, t)) continue;
          pg.reduce_scatter(view(out, t), view(in, t), {.op = op})->wait();
          check_values(out, t, block, [&](size_t i) { return expected_reduction(op, t, n(), rank() * block + i); },
                       fmt::format("reduce_scatter {} {}", to_string(op), dt));
        }
      }
      note("all_reduce", "cpu", dt, reduces(backend, t));
      note("reduce", "cpu", dt, reduces(backend, t));
      note("reduce_scatter", "cpu", dt, reduces(backend, t));
    }
  }

  // Data movement of i32, f16 and bf16 (moved as bytes by every backend).
  void movement(const std::vector<size_t>& counts) {
    for (DType t : {DType::kI32, DType::kF16, DType::kBF16}) {
      const std::string dt(to_string(t));
      for (size_t count : counts) {
        if (count > 4096 && t != DType::kI32) continue;
        auto value = [&](int r, size_t i) { return static_cast<double>((r * 7 + i) % 100); };
        // broadcast from the last rank
        auto b = filled(t, count, [&](size_t i) { return rank() == n() - 1 ? value(n() - 1, i) : -1; });
        pg.broadcast(view(b, t), {.root = n() - 1})->wait();
        check_values(b, t, count, [&](size_t i) { return value(n() - 1, i); }, fmt::format("broadcast {} x {}", dt, count));
        // allgather
        auto in = filled(t, count, [&](size_t i) { return value(rank(), i); });
        std::vector<std::byte> out(in.size() * n());
        pg.allgather(view(out, t), view(in, t))->wait();
        check_values(out, t, count * n(), [&](size_t i) { return value(i / count, i % count); },
                     fmt::format("all_gather {} x {}", dt, count));
        // gather to rank 0, scatter from rank 0
        std::vector<std::byte> g(rank() == 0 ? in.size() * n() : 0);
        pg.gather(view(g, t), view(in, t), {.root = 0})->wait();
        if (rank() == 0)
          check_values(g, t, count * n(), [&](size_t i) { return value(i / count, i % count); },
                       fmt::format("gather {} x {}", dt, count));
        auto src = filled(t, rank() == 0 ? count * n() : 0, [&](size_t i) { return value(i / count, i % count) + 1; });
        std::vector<std::byte> s(in.size());
        pg.scatter(view(s, t), view(src, t), {.root = 0})->wait();
        check_values(s, t, count, [&](size_t i) { return value(rank(), i) + 1; }, fmt::format("scatter {} x {}", dt, count));
        // alltoall: block j of rank r holds r*10+j
        if (count <= 4096) {
          auto a = filled(t, count * n(), [&](size_t i) { return rank() * 10 + i / count; });
          std::vector<std::byte> ao(a.size());
          pg.alltoall(view(ao, t), view(a, t))->wait();
          check_values(ao, t, count * n(), [&](size_t i) { return (i / count) * 10 + rank(); },
                       fmt::format("all_to_all {} x {}", dt, count));
        }
      }
      // allgatherv: rank r contributes r+1 elements (and rank 0 none, to include a zero)
      {
        std::vector<size_t> counts_v(n());
        size_t total = 0;
        for (int r = 0; r < n(); ++r) total += counts_v[r] = r == 0 ? 0 : r + 1;
        auto in = filled(t, counts_v[rank()], [&](size_t i) { return rank() * 10 + i; });
        std::vector<std::byte> out(total * element_size(t));
        pg.allgatherv(view(out, t), view(in, t), counts_v)->wait();
        std::vector<double> want;
        for (int r = 0; r < n(); ++r)
          for (size_t i = 0; i < counts_v[r]; ++i) want.push_back(r * 10 + i);
        check_values(out, t, total, [&](size_t i) { return want[i]; }, "all_gather_v " + dt);
      }
      // alltoallv: rank r sends (r + j) % 3 elements to rank j
      {
        std::vector<size_t> ic(n()), oc(n());
        size_t it = 0, ot = 0;
        for (int j = 0; j < n(); ++j) {
          it += ic[j] = (rank() + j) % 3;
          ot += oc[j] = (j + rank()) % 3;
        }
        std::vector<double> iv, want;
        for (int j = 0; j < n(); ++j)
          for (size_t k = 0; k < ic[j]; ++k) iv.push_back(rank() * 10 + j + k);
        for (int i = 0; i < n(); ++i)
          for (size_t k = 0; k < oc[i]; ++k) want.push_back(i * 10 + rank() + k);
        auto in = filled(t, it, [&](size_t i) { return iv[i]; });
        std::vector<std::byte> out(ot * element_size(t));
        pg.alltoallv(view(out, t), oc, view(in, t), ic)->wait();
        check_values(out, t, ot, [&](size_t i) { return want[i]; }, "all_to_all_v " + dt);
      }
      for (const char* op : {"broadcast", "all_gather", "all_gather_v", "gather", "scatter", "all_to_all", "all_to_all_v"})
        note(op, "cpu", dt, true);
    }
    pg.barrier()->wait();
    note("barrier", "cpu", "", true);
  }

  // A ring of sends and receives, in several sizes, two tags in flight at once.
  void p2p(const std::vector<size_t>& counts) {
    if (n() < 2) return;
    const int next = (rank() + 1) % n(), prev = (rank() + n() - 1) % n();
    for (size_t count : counts) {
      auto out1 = filled(DType::kF32, count, [&](size_t i) { return rank() * 1000 + i % 997; });
      auto out2 = filled(DType::kF32, count, [&](size_t i) { return rank() * 3 + 1.0; });
      std::vector<std::byte> in1(out1.size()), in2(out2.size());
      auto r2 = pg.irecv(view(in2, DType::kF32), prev, 2);
      auto r1 = pg.irecv(view(in1, DType::kF32), prev, 1);
      auto s1 = pg.isend(view(out1, DType::kF32), next, 1);
      auto s2 = pg.isend(view(out2, DType::kF32), next, 2);
      s1->wait(); s2->wait(); r1->wait(); r2->wait();
      RANK_CHECK(r1->is_completed() && r1->is_success(), "recv not complete after wait");
      check_values(in1, DType::kF32, count, [&](size_t i) { return prev * 1000 + i % 997; }, "recv tag 1");
      check_values(in2, DType::kF32, count, [&](size_t) { return prev * 3 + 1.0; }, "recv tag 2");
    }
    note("send_recv", "cpu", "", true);
  }

  // A receive nobody sends to ends with a TimeoutError naming the operation and the peer.
  void p2p_timeout() {
    if (n() < 2 || rank() != 0) return;
    std::vector<float> x(16);
    // The wait gives up before the operation's own deadline: a cancel, which (unlike gloo's own
    // timeout, that closes every connection) leaves the group usable.
    auto w = pg.irecv(TensorView::of(x), 1, 77, {.timeout = std::chrono::seconds(20)});
    try {
      w->wait(std::chrono::milliseconds(300));
      throw std::runtime_error("a receive nobody sends to completed");
    } catch (const TimeoutError& e) {
      const std::string text = e.what();
      RANK_CHECK(text.find("recv") != std::string::npos && text.find("rank 1") != std::string::npos,
                 "the timeout does not name the op and peer: {}", text);
    }
  }

  // Every operation on a CUDA tensor fails with the named error, before anything is sent.
  void cuda_refused() {
    static float dummy[64];
    TensorView c{dummy, 4, DType::kF32, Device::kCuda};
    TensorView o{dummy, static_cast<size_t>(4 * n()), DType::kF32, Device::kCuda};
    std::vector<size_t> counts(n(), 4);
    const std::vector<std::pair<std::string, std::function<void()>>> ops = {
        {"all_reduce", [&] { pg.allreduce(c); }},
        {"broadcast", [&] { pg.broadcast(c); }},
        {"reduce", [&] { pg.reduce(c); }},
        {"all_gather", [&] { pg.allgather(o, c); }},
        {"all_gather_v", [&] { pg.allgatherv(o, c, counts); }},
        {"gather", [&] { pg.gather(o, c); }},
        {"scatter", [&] { pg.scatter(c, o); }},
        {"reduce_scatter", [&] { pg.reduce_scatter(c, o); }},
        {"all_to_all", [&] { pg.alltoall(o, o); }},
        {"all_to_all_v", [&] { pg.alltoallv(o, counts, o, counts); }},
        {"send_recv", [&] { pg.isend(c, (rank() + 1) % n()); }},
    };
    for (const auto& [op, f] : ops) {
      if (op == "send_recv" && n() < 2) continue;
      expect_unsupported(backend, op + " on CUDA", f);
      note(op, "cuda", "", false);
    }
  }

  // Sub-groups: the ranks in reverse order, and the even ranks; checked with all-reduce,
  // broadcast and a barrier; non-members get null.
  void subgroups() {
    std::vector<int> reversed, evens;
    for (int r = n() - 1; r >= 0; --r) reversed.push_back(r);
    for (int r = 0; r < n(); r += 2) evens.push_back(r);
    auto rev = pg.new_group(reversed);
    auto even = pg.new_group(evens);
    RANK_CHECK(rev && rev->rank() == n() - 1 - rank() && rev->size() == n(), "reversed sub-group");
    RANK_CHECK((even != nullptr) == (rank() % 2 == 0), "even sub-group membership");
    for (auto* g : {rev.get(), even.get()}) {
      if (!g) continue;
      std::vector<int32_t> x(1000, g->rank() + 1);
      g->allreduce(TensorView::of(x))->wait();
      const int want = g->size() * (g->size() + 1) / 2;
      for (int v : x) RANK_CHECK(v == want, "sub-group all_reduce gave {} not {}", v, want);
      std::vector<int32_t> b(33, g->rank() == 0 ? 42 : 0);
      g->broadcast(TensorView::of(b), {.root = 0})->wait();
      for (int v : b) RANK_CHECK(v == 42, "sub-group broadcast gave {}", v);
      g->barrier()->wait();
    }
    note("new_group", "cpu", "", true);
  }

  void all(const std::vector<size_t>& counts) {
    reductions(counts);
    movement(counts);
    p2p(counts);
    subgroups();
    p2p_timeout();
    pg.barrier()->wait();
  }
};

}  // namespace dtrain::testing::backends
