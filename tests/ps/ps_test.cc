// The parameter server over real processes and sockets: servers and workers are forked processes
// that meet through a store; values are checked against references computed here.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/handshake.h"
#include "common/socket.h"
#include "dtrain/error.h"
#include "ps/sparse_table.h"
#include "ps/table_spec.h"
#include "ps/ps_job.h"
#include "support/addresses.h"
#include "support/peer_closed.h"

namespace dtrain::testing {
namespace {

using namespace std::chrono_literals;
using ps::Client;
using ps::Consistency;
using ps::OptimizerOptions;
using ps::TableOptions;

// Runs `fn`, expecting it to throw an E whose message holds every one of `parts`.
template <typename E>
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const E& e) {
    for (const auto& p : parts)
      RANK_CHECK(std::string(e.what()).find(p) != std::string::npos, "'{}' not in: {}", p,
                 e.what());
    return;
  }
  RANK_CHECK(false, "no error was thrown");
}

std::vector<float> iota_values(size_t n, float step) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * step;
  return v;
}

// Dense sync SGD over 2 servers and 3 workers, with a small table (whole on one server), a cut
// one (a slice per server) and one whose slices span two chunks each: every worker sees
// w - lr * mean(gradients) after each step.
TEST(PsTest, DenseSyncAveragesTheWorkersGradientsOnce) {
  PsJob job(2, 3);
  auto results = job.run([&](int w) {
    Client c(job.client_options(w));
    TableOptions opt;
    opt.optimizer.lr = 0.5f;
    const std::vector<size_t> sizes = {10, 300'000, 600'000};
    std::vector<std::vector<float>> expected;
    for (size_t t = 0; t < sizes.size(); ++t) {
      auto init = iota_values(sizes[t], 0.001f);
      c.create_dense(fmt::format("t{}", t), TensorView::of(init), opt);
      expected.push_back(init);
    }
    for (int step = 0; step < 3; ++step) {
      for (size_t t = 0; t < sizes.size(); ++t) {
        const size_t n = sizes[t];
        std::vector<float> grad(n), out(n);
        for (size_t i = 0; i < n; ++i) grad[i] = static_cast<float>((w + 1) * (step + 1) + i % 7);
        c.push_pull(fmt::format("t{}", t), TensorView::of(grad), TensorView::of(out)).wait();
        for (size_t i = 0; i < n; ++i) {
          const float sum = static_cast<float>(6 * (step + 1) + 3 * (i % 7));
          expected[t][i] -= opt.optimizer.lr * (sum * (1.0f / 3.0f) + 0.0f * expected[t][i]);
          RANK_CHECK(std::fabs(out[i] - expected[t][i]) <= 1e-5f * (1 + std::fabs(expected[t][i])),
                     "worker {} table {} step {} element {}: {} != {}", w, t, step, i, out[i],
                     expected[t][i]);
        }
      }
    }
  });
  expect_all_ok(results);
}

// Server-side momentum and Adam give what torch.optim's formulas give, computed here.
TEST(PsTest, MomentumAndAdamMatchTheReference) {
  PsJob job(1, 2);
  auto results = job.run([&](int w) {
    Client c(job.client_options(w));
    const size_t n = 64;
    TableOptions mom;
    mom.optimizer.kind = OptimizerOptions::Kind::kMomentum;
    mom.optimizer.lr = 0.1f;
    mom.optimizer.momentum = 0.9f;
    mom.optimizer.weight_decay = 0.01f;
    TableOptions adam;
    adam.optimizer.kind = OptimizerOptions::Kind::kAdam;
    adam.optimizer.lr = 0.01f;
    auto w_mom = iota_values(n, 0.1f), w_adam = iota_values(n, 0.1f);
    c.create_dense("mom", TensorView::of(w_mom), mom);
    c.create_dense("adam", TensorView::of(w_adam), adam);
    std::vector<double> v(n, 0), m(n, 0), s(n, 0);
    std::vector<double> ref_mom(w_mom.begin(), w_mom.end()), ref_adam(w_adam.begin(), w_adam.end());
    for (int t = 1; t <= 4; ++t) {
      std::vector<float> g(n), out(n);
      for (size_t i = 0; i < n; ++i) g[i] = std::sin(static_cast<float>(i + t * 3 + w));
      c.push_pull("mom", TensorView::of(g), TensorView::of(out)).wait();
      std::vector<float> out_adam(n);
      c.push_pull("adam", TensorView::of(g), TensorView::of(out_adam)).wait();
      for (size_t i = 0; i < n; ++i) {
        double mean = (std::sin(static_cast<double>(i + t * 3)) +
                       std::sin(static_cast<double>(i + t * 3 + 1))) / 2;
        double gm = mean + 0.01 * ref_mom[i];
        v[i] = t == 1 ? gm : 0.9 * v[i] + gm;
        ref_mom[i] -= 0.1 * v[i];
        m[i] = 0.9 * m[i] + 0.1 * mean;
        s[i] = 0.999 * s[i] + 0.001 * mean * mean;
        double mhat = m[i] / (1 - std::pow(0.9, t)), shat = s[i] / (1 - std::pow(0.999, t));
        ref_adam[i] -= 0.01 * mhat / (std::sqrt(shat) + 1e-8);
        RANK_CHECK(std::fabs(out[i] - ref_mom[i]) < 1e-4, "momentum step {} [{}]: {} vs {}", t, i,
                   out[i], ref_mom[i]);
        RANK_CHECK(std::fabs(out_adam[i] - ref_adam[i]) < 1e-4, "adam step {} [{}]: {} vs {}", t,
                   i, out_adam[i], ref_adam[i]);
      }
    }
  });
  expect_all_ok(results);
}

// Summation only (the BytePS design): with sync, a pull returns the sum of the step's gradients,
// for workers that run their own optimizer.
TEST(PsTest, SumOnlyTablesReturnTheStepsSum) {
  PsJob job(2, 3);
  auto results = job.run([&](int w) {
    Client c(job.client_options(w));
    TableOptions opt;
    opt.optimizer.kind = OptimizerOptions::Kind::kSum;
    std::vector<float> zeros(200'000, 0.0f);  // cut across both servers
    c.create_dense("g", TensorView::of(zeros), opt);
    for (int step = 1; step <= 3; ++step) {
      std::vector<float> grad(zeros.size()), sum(zeros.size());
      for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(step * (w + 1) + i % 3);
      c.push_pull("g", TensorView::of(grad), TensorView::of(sum)).wait();
      for (size_t i = 0; i < sum.size(); i += 1009)
        RANK_CHECK(sum[i] == static_cast<float>(6 * step + 3 * (i % 3)), "step {} [{}]: {}", step,
                   i, sum[i]);
    }
  });
  expect_all_ok(results);
}

// Asynchronous: every push is applied as it arrives, none waits for the others.
TEST(PsTest, AsyncAppliesEveryPush) {
  PsJob job(2, 2);
  auto results = job.run([&](int w) {
    Client c(job.client_options(w));
    TableOptions opt;
    opt.consistency = Consistency::kAsync;
    opt.optimizer.lr = 1.0f;
    std::vector<float> init(200'000, 100.0f);  // cut across both servers
    c.create_dense("w", TensorView::of(init), opt);
    std::vector<float> ones(init.size(), 1.0f);
    const int pushes = 5 + 3 * w;  // the workers push different counts: nobody waits
    for (int k = 0; k < pushes; ++k) c.push("w", TensorView::of(ones)).wait();
    auto store = job.store();
    store->add("pushed", 1);
    store->wait({"pushed"});
    while (store->add("pushed", 0) < 2) std::this_thread::sleep_for(5ms);
    std::vector<float> out(init.size());
    c.pull("w", TensorView::of(out)).wait();
    for (size_t i = 0; i < out.size(); i += 997)
      RANK_CHECK(out[i] == 100.0f - 13.0f, "element {} is {}", i, out[i]);
  });
  expect_all_ok(results);
}

// SSP with staleness s: when a pull returns to a worker that pushed c times, every worker has
// pushed at least c - s times. A slow worker announces each push in the store before making it,
// so the store's count is never behind the server's. With async the fast worker runs far ahead
// (the control that shows the check can fail).
int max_lead(Consistency mode, uint32_t staleness) {
  PsJob job(1, 2);
  auto store = job.store();
  auto results = job.run([&](int w) {
    Client c(job.client_options(w));
    TableOptions opt;
    opt.consistency = mode;
    opt.staleness = staleness;
    std::vector<float> x(16, 0.0f), g(16, 0.01f);
    c.create_dense("x", TensorView::of(x), opt);
    auto s = job.store();
    int lead = 0;
    for (int k = 1; k <= 12; ++k) {
      if (w == 0) {
        s->set("slow", std::to_string(k));
        std::this_thread::sleep_for(40ms);
      }
      c.push_pull("x", TensorView::of(g), TensorView::of(x)).wait();
      if (w == 1) {
        int slow = s->check({"slow"}) ? std::stoi(s->get_string("slow")) : 0;
        lead = std::max(lead, k - slow);
      }
    }
    if (w == 1) s->set("lead", std::to_string(lead));
  });
  expect_all_ok(results);
  return std::stoi(store->get_string("lead"));
}

TEST(PsTest, BoundedStalenessKeepsWorkersWithinS) {
  EXPECT_LE(max_lead(Consistency::kBounded, 2), 2);
  EXPECT_GT(max_lead(Consistency::kAsync, 2), 2);
}

// Sparse rows: created on first touch from the initializer, spread over 3 servers, repeated ids
// pulled once and pushed combined, averaged over the workers (sync).
TEST(PsTest, SparseRowsAreCreatedOnTouchCombinedAndAveraged) {
  PsJob job(3, 2);
  auto results = job.run([&](int w) {
    Client c(job.client_options(w));
    ps::SparseTableOptions so;
    so.width = 4;
    so.init = {ps::RowInit::Kind::kUniform, -1.0f, 1.0f, 7};
    so.table.optimizer.lr = 1.0f;
    c.create_sparse("emb", so);
    ps::TableSpec spec;
    spec.sparse = true;
    spec.width = 4;
    spec.init = so.init;
    const std::vector<uint64_t> ids = {5, 99, 5, uint64_t{1} << 40, 12345678901ull};
    std::vector<float> out(ids.size() * 4);
    c.pull_rows("emb", ids, TensorView::of(out)).wait();
    for (size_t r = 0; r < ids.size(); ++r) {
      float row[4];
      ps::SparseTable::init_row(spec, ids[r], row);
      for (int j = 0; j < 4; ++j) {
        RANK_CHECK(out[r * 4 + j] == row[j], "row {} [{}]: {} != {}", ids[r], j, out[r * 4 + j],
                   row[j]);
        RANK_CHECK(row[j] >= -1.0f && row[j] < 1.0f, "init outside [-1, 1): {}", row[j]);
      }
    }
    // Worker w pushes id 5 twice (combined: 2 per worker) and id 7 once with weight w + 1.
    const std::vector<uint64_t> push_ids = {5, 7, 5};
    std::vector<float> grads(12, 1.0f);
    for (int j = 4; j < 8; ++j) grads[j] = static_cast<float>(w + 1);
    c.push_rows("emb", push_ids, TensorView::of(grads)).wait();
    std::vector<float> after(8);
    const std::vector<uint64_t> check_ids = {5, 7};
    c.pull_rows("emb", check_ids, TensorView::of(after)).wait();
    float r5[4], r7[4];
    ps::SparseTable::init_row(spec, 5, r5);
    ps::SparseTable::init_row(spec, 7, r7);
    for (int j = 0; j < 4; ++j) {
      RANK_CHECK(std::fabs(after[j] - (r5[j] - 2.0f)) < 1e-6f, "id 5 [{}]: {}", j, after[j]);
      RANK_CHECK(std::fabs(after[4 + j] - (r7[j] - 1.5f)) < 1e-6f, "id 7 [{}]: {}", j,
                 after[4 + j]);
    }
  });
  expect_all_ok(results);
}

// Rows nobody touched for evict_after are dropped and start again from the initializer.
TEST(PsTest, IdleSparseRowsAreEvicted) {
  PsJob job(1, 1);
  auto results = job.run([&](int w) {
    Client c(job.client_options(w));
    ps::SparseTableOptions so;
    so.width = 2;
    so.init = {ps::RowInit::Kind::kUniform, 0.0f, 1.0f, 5};
    so.table.consistency = Consistency::kAsync;
    so.table.optimizer.lr = 1.0f;
    so.evict_after = 1s;
    c.create_sparse("emb", so);
    const std::vector<uint64_t> ids = {42};
    std::vector<float> fresh(2), row(2), g = {10.0f, 10.0f};
    c.pull_rows("emb", ids, TensorView::of(fresh)).wait();
    c.push_rows("emb", ids, TensorView::of(g)).wait();
    c.pull_rows("emb", ids, TensorView::of(row)).wait();
    RANK_CHECK(row[0] == fresh[0] - 10.0f, "the push was not applied: {}", row[0]);
    std::this_thread::sleep_for(2500ms);  // idle past evict_after; the server sweeps every second
    c.pull_rows("emb", ids, TensorView::of(row)).wait();
    RANK_CHECK(row == fresh, "row 42 was not evicted: {} (fresh {})", row[0], fresh[0]);
  });
  expect_all_ok(results);
}

// A server killed mid-training: every worker's next call fails within a second, naming it.
TEST(PsTest, KilledServerFailsEveryWorkerFastNamingIt) {
  PsJob job(2, 2);
  auto results = job.run([&](int w) {
    Client c(job.client_options(w));
    std::vector<float> x(300'000, 1.0f), g(300'000, 0.001f);  // cut across both servers
    c.create_dense("x", TensorView::of(x));
    auto s = job.store();
    for (int k = 0;; ++k) {
      if (w == 0 && k == 5) ::kill(std::stoi(s->get_string("pid/1")), SIGKILL);
      auto start = std::chrono::steady_clock::now();
      try {
        c.push_pull("x", TensorView::of(g), TensorView::of(x)).wait();
      } catch (const PeerFailureError& e) {
        double s_taken = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        RANK_CHECK(std::string(e.what()).find("ps server 1 at 127.0.0.1:") != std::string::npos,
                   "{}", e.what());
        RANK_CHECK(s_taken < 1.0, "failing took {:.2f} s", s_taken);
        std::fprintf(stderr, "worker %d: %s\n", w, e.what());
        s->set("stop", "1");  // the workers exit without goodbyes: tell server 0 to end
        ::_exit(3);
      }
      RANK_CHECK(k < 200, "no failure after killing server 1");
    }
  });
  EXPECT_EQ(results[1].signal, SIGKILL);
  EXPECT_TRUE(results[0].ok());
  EXPECT_EQ(results[2].exit_code, 3);
  EXPECT_EQ(results[3].exit_code, 3);
}

// A worker that dies: a sync pull waiting for its push fails at once, naming it.
TEST(PsTest, KilledWorkerFailsTheSyncPullsThatWaitForIt) {
  PsJob job(1, 2);
  auto results = job.run([&](int w) {
    Client c(job.client_options(w));
    std::vector<float> x(100, 1.0f), g(100, 0.5f);
    c.create_dense("x", TensorView::of(x));
    for (int k = 0; k < 3; ++k) c.push_pull("x", TensorView::of(g), TensorView::of(x)).wait();
    if (w == 1) ::kill(::getpid(), SIGKILL);
    auto start = std::chrono::steady_clock::now();
    expect_error<PeerFailureError>(
        [&] { c.push_pull("x", TensorView::of(g), TensorView::of(x)).wait(); },
        {"worker 1 at 127.0.0.1:", "without saying goodbye", "table 'x'"});
    RANK_CHECK(std::chrono::steady_clock::now() - start < 2s, "failing took too long");
    job.store()->set("stop", "1");
  });
  EXPECT_EQ(results[2].signal, SIGKILL);
  EXPECT_TRUE(results[1].ok());
}

// Live recovery: the workers left after a death tell the server to forget it; the pushes of the
// step it cut short are dropped, the others redo the step without it, and it counts once.
TEST(PsTest, ForgettingADeadWorkerDropsTheStepInProgressForTheOthersToRedo) {
  PsJob job(1, 3);
  auto results = job.run([&](int w) {
    Client c(job.client_options(w));
    std::vector<float> x(100, 1.0f);
    TableOptions opt;
    opt.optimizer.lr = 0.5f;
    c.create_dense("x", TensorView::of(x), opt);
    std::vector<float> g(100, static_cast<float>(w + 1));
    c.push_pull("x", TensorView::of(g), TensorView::of(x)).wait();  // 1 - 0.5 * mean(1, 2, 3)
    RANK_CHECK(x[0] == 0.0f, "after step 0: {}", x[0]);
    if (w == 2) ::kill(::getpid(), SIGKILL);  // before its push of step 1
    std::vector<float> big(100, 10.0f * static_cast<float>(w + 1));
    expect_error<PeerFailureError>(
        [&] { c.push_pull("x", TensorView::of(big), TensorView::of(x)).wait(); },
        {"worker 2 at 127.0.0.1:", "without saying goodbye"});
    c.forget_worker(2);
    expect_error<InvalidArgumentError>([&] { c.forget_worker(7); },
                                       {"not one of the job's 3 workers"});
    // Nobody pushes again before both have asked (live recovery's all-reduce does this).
    job.store()->add("forgot", 1);
    while (job.store()->add("forgot", 0) < 2) std::this_thread::sleep_for(1ms);
    c.push_pull("x", TensorView::of(g), TensorView::of(x)).wait();  // 0 - 0.5 * mean(1, 2)
    RANK_CHECK(x[0] == -0.75f, "after the redone step 1: {} (the dropped pushes counted?)", x[0]);
    c.push_pull("x", TensorView::of(g), TensorView::of(x)).wait();  // the two go on together
    RANK_CHECK(x[0] == -1.5f, "after step 2: {}", x[0]);
  });
  EXPECT_EQ(results[3].signal, SIGKILL);
  EXPECT_TRUE(results[0].ok());  // the server ends once the others said goodbye
  EXPECT_TRUE(results[1].ok());
  EXPECT_TRUE(results[2].ok());
}

// A worker the others went on without (late, not dead) is forgotten with its connection: a
// request on it is refused, naming it; connected anew, it counts in the next synchronous step.
TEST(PsTest, AForgottenWorkersConnectionIsRefusedAndANewOneTakesPartAgain) {
  PsJob job(1, 3);
  auto results = job.run([&](int w) {
    std::vector<float> x(100, 1.0f);
    TableOptions opt;
    opt.optimizer.lr = 0.5f;
    auto c = std::make_unique<Client>(job.client_options(w));
    c->create_dense("x", TensorView::of(x), opt);
    std::vector<float> g(100, static_cast<float>(w + 1));
    c->push_pull("x", TensorView::of(g), TensorView::of(x)).wait();  // 1 - 0.5 * mean(1, 2, 3)
    RANK_CHECK(x[0] == 0.0f, "after step 0: {}", x[0]);
    auto wait_for = [&](const std::string& key, int64_t n) {
      while (job.store()->add(key, 0) < n) std::this_thread::sleep_for(1ms);
    };
    if (w < 2) {
      c->forget_worker(2);
      job.store()->add("forgot", 1);
    } else {
      wait_for("forgot", 2);
      expect_error<InvalidArgumentError>(
          [&] { c->push_pull("x", TensorView::of(g), TensorView::of(x)).wait(); },
          {"worker 2's connection from 127.0.0.1:", "was forgotten"});
      c = std::make_unique<Client>(job.client_options(w));
      c->create_dense("x", TensorView::of(x), opt);  // attaches to the table
      job.store()->add("back", 1);
    }
    wait_for("back", 1);
    c->push_pull("x", TensorView::of(g), TensorView::of(x)).wait();  // 0 - 0.5 * mean(1, 2, 3)
    RANK_CHECK(x[0] == -1.0f, "after step 1: {} (worker 2's push not counted?)", x[0]);
  });
  for (const auto& r : results) EXPECT_TRUE(r.ok());
}

// A worker whose Client is destroyed by an exception unwinding it says no goodbye: the other
// worker's sync pull fails naming it, instead of training on alone.
TEST(PsTest, AWorkerFailingWithAnExceptionIsNotALeave) {
  PsJob job(1, 2);
  auto results = job.run([&](int w) {
    std::vector<float> x(100, 1.0f), g(100, 0.5f);
    if (w == 1) {
      try {
        Client c(job.client_options(w));
        c.create_dense("x", TensorView::of(x));
        c.push_pull("x", TensorView::of(g), TensorView::of(x)).wait();
        throw std::runtime_error("the worker's own bug");
      } catch (const std::runtime_error&) {
        ::_exit(3);
      }
    }
    Client c(job.client_options(w));
    c.create_dense("x", TensorView::of(x));
    c.push_pull("x", TensorView::of(g), TensorView::of(x)).wait();
    expect_error<PeerFailureError>(
        [&] { c.push_pull("x", TensorView::of(g), TensorView::of(x)).wait(); },
        {"worker 1 at 127.0.0.1:", "without saying goodbye"});
    job.store()->set("stop", "1");
  });
  EXPECT_EQ(results[2].exit_code, 3);
  EXPECT_TRUE(results[1].ok());
}

// Bad requests get clear errors and change nothing; garbage on the port is refused and the
// server keeps serving.
TEST(PsTest, BadRequestsAreRefusedAndChangeNothing) {
  PsJob job(1, 2);
  auto results = job.run([&](int w) {
    Client c(job.client_options(w));
    auto s = job.store();
    std::vector<float> x(8, 2.0f);
    ps::SparseTableOptions so;
    so.width = 4;
    if (w == 0) {
      c.create_dense("t", TensorView::of(x));
      c.create_sparse("e", so);
      s->set("created", "1");
    } else {
      s->wait({"created"});
      std::vector<float> other(16, 5.0f);
      expect_error<InvalidArgumentError>(
          [&] { c.create_dense("t", TensorView::of(other)); },
          {"table 't'", "numel", "16", "8"});
      so.width = 8;
      expect_error<InvalidArgumentError>([&] { c.create_sparse("e", so); },
                                         {"table 'e'", "width"});
      so.width = 4;
      c.create_sparse("e", so);
      expect_error<InvalidArgumentError>([&] { c.pull("nope", TensorView::of(x)); },
                                         {"table 'nope'", "create_dense"});
      c.create_dense("t", TensorView::of(x));
      std::vector<double> wrong(8, 1.0);
      expect_error<InvalidArgumentError>([&] { c.push("t", TensorView::of(wrong)); },
                                         {"f32", "f64"});
      std::vector<float> short_grad(7, 1.0f);
      expect_error<InvalidArgumentError>([&] { c.push("t", TensorView::of(short_grad)); },
                                         {"8 elements", "7"});
      std::vector<uint64_t> ids = {1, 2};
      std::vector<float> rows(6);
      expect_error<InvalidArgumentError>([&] { c.pull_rows("e", ids, TensorView::of(rows)); },
                                         {"2 ids of width 4"});
      // Garbage on the server's port.
      auto addr = net::parse_host_port(s->get_string("ps/server/0"), "server");
      net::Fd fd = net::connect_tcp(addr, Deadline::after(5s), "garbage");
      const char junk[] = "GET / HTTP/1.0\r\n\r\n";
      ::send(fd.get(), junk, sizeof(junk), MSG_NOSIGNAL);
      s->set("checked", "1");
    }
    s->wait({"checked"});
    std::vector<float> out(8);
    c.pull("t", TensorView::of(out)).wait();
    for (float v : out) RANK_CHECK(v == 2.0f, "table t changed: {}", v);
  });
  expect_all_ok(results);
}

// Checkpoint, then restart the server from it: values, optimizer state and clocks come back, so
// the next step equals the step of the server that never stopped. A corrupt newest checkpoint is
// skipped for the one before it.
TEST(PsTest, ServerCheckpointRestoresTablesAndOptimizerState) {
  const std::string dir = ::testing::TempDir() + fmt::format("ps_ckpt_{}", ::getpid());
  std::filesystem::remove_all(dir);
  TableOptions mom;
  mom.optimizer.kind = OptimizerOptions::Kind::kMomentum;
  mom.optimizer.lr = 0.1f;
  ps::SparseTableOptions so;
  so.width = 3;
  so.init = {ps::RowInit::Kind::kNormal, 0.0f, 1.0f, 3};
  so.table = mom;
  const std::vector<uint64_t> ids = {1, 2, 1000};
  auto step = [&](Client& c, int k, std::vector<float>& x, std::vector<float>& rows) {
    std::vector<float> g(x.size()), rg(rows.size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = std::cos(static_cast<float>(i + k));
    for (size_t i = 0; i < rg.size(); ++i) rg[i] = std::sin(static_cast<float>(i + k));
    c.push_pull("x", TensorView::of(g), TensorView::of(x)).wait();
    c.push_rows("emb", ids, TensorView::of(rg)).wait();
    c.pull_rows("emb", ids, TensorView::of(rows)).wait();
  };
  ps::ServerOptions server;
  server.checkpoint_dir = dir;
  std::vector<float> first_ckpt_values;
  {
    PsJob job(1, 1);
    auto results = job.run(
        [&](int w) {
          Client c(job.client_options(w));
          std::vector<float> x = iota_values(1000, 0.01f), rows(9);
          c.create_dense("x", TensorView::of(x), mom);
          c.create_sparse("emb", so);
          auto s = job.store();
          for (int k = 0; k < 2; ++k) step(c, k, x, rows);
          c.checkpoint();
          s->set("first", std::string(reinterpret_cast<char*>(x.data()), x.size() * 4));
          step(c, 2, x, rows);
          auto paths = c.checkpoint();
          RANK_CHECK(paths.size() == 1 && paths[0].find("server-0/ckpt-") != std::string::npos,
                     "checkpoint paths {}", fmt::join(paths, ","));
          step(c, 3, x, rows);  // the step the restored server must reproduce
          s->set("x", std::string(reinterpret_cast<char*>(x.data()), x.size() * 4));
          s->set("rows", std::string(reinterpret_cast<char*>(rows.data()), rows.size() * 4));
        },
        server);
    expect_all_ok(results);
    auto s = job.store();
    std::string first = s->get_string("first");
    first_ckpt_values.resize(1000);
    std::memcpy(first_ckpt_values.data(), first.data(), first.size());

    server.restore = true;
    PsJob again(1, 1);
    auto store = again.store();
    store->set("x", s->get_string("x"));
    store->set("rows", s->get_string("rows"));
    auto restored = again.run(
        [&](int w) {
          Client c(again.client_options(w));
          std::vector<float> zeros(1000, 0.0f), x(1000), rows(9);
          c.create_dense("x", TensorView::of(zeros), mom);  // attaches: the restored values win
          c.create_sparse("emb", so);
          step(c, 3, x, rows);
          auto sx = again.store()->get_string("x");
          auto srows = again.store()->get_string("rows");
          RANK_CHECK(std::memcmp(sx.data(), x.data(), sx.size()) == 0, "dense values differ");
          RANK_CHECK(std::memcmp(srows.data(), rows.data(), srows.size()) == 0,
                     "sparse rows differ");
        },
        server);
    expect_all_ok(restored);
  }
  // Corrupt the newest checkpoint: the restore skips it and falls back to the first one.
  std::vector<std::filesystem::path> ckpts;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/server-0")) ckpts.push_back(e.path());
  std::sort(ckpts.begin(), ckpts.end());
  ASSERT_EQ(ckpts.size(), 2u);
  {
    std::fstream f(ckpts.back() / "tables.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-16, std::ios::end);
    f.write("corrupt!corrupt!", 16);
  }
  PsJob third(1, 1);
  third.store()->set("first", std::string(reinterpret_cast<char*>(first_ckpt_values.data()),
                                          first_ckpt_values.size() * 4));
  auto check = third.run(
      [&](int w) {
        Client c(third.client_options(w));
        std::vector<float> zeros(1000, 0.0f), x(1000);
        c.create_dense("x", TensorView::of(zeros), mom);
        c.create_sparse("emb", so);
        c.pull("x", TensorView::of(x)).wait();
        auto first = third.store()->get_string("first");
        RANK_CHECK(std::memcmp(first.data(), x.data(), first.size()) == 0,
                   "the restore did not fall back to the first checkpoint");
      },
      server);
  expect_all_ok(check);
  std::filesystem::remove_all(dir);
}

// The keepalive probes a TCP socket of this process sends before giving up on its peer, for each
// socket connected to or from `port` on loopback.
std::vector<int> keepalive_probes_on_port(uint16_t port) {
  std::vector<int> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(e.path().filename());
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof(local), pl = sizeof(peer);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
        ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0 ||
        local.ss_family != AF_INET)
      continue;
    const uint16_t lp = ntohs(reinterpret_cast<sockaddr_in&>(local).sin_port);
    const uint16_t pp = ntohs(reinterpret_cast<sockaddr_in&>(peer).sin_port);
    if (lp != port && pp != port) continue;
    int probes = 0;
    socklen_t len = sizeof(probes);
    if (::getsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, &len) == 0) out.push_back(probes);
  }
  return out;
}

// Both ends of a worker's link keep the transport's keepalive (five probes): three lost in a row
// on a lossy link closed healthy connections (src/common/socket.h).
TEST(PsTest, WorkerLinksKeepThePeersKeepalive) {
  ps::ServerOptions so;
  so.listen_host = "127.0.0.1";
  ps::Server server(so);
  ps::ClientOptions co;
  co.servers = {server.address()};
  ps::Client client(co);
  std::vector<float> w(4, 1.0f);
  client.create_dense("w", TensorView::of(w), {});
  const auto colon = server.address().rfind(':');
  const auto port = static_cast<uint16_t>(std::stoi(server.address().substr(colon + 1)));
  const auto probes = keepalive_probes_on_port(port);
  ASSERT_GE(probes.size(), 2u) << "the client's socket and the server's";
  for (int p : probes) EXPECT_EQ(p, net::kPeerKeepalive.probes);
}

// Without a token, one forged hello claiming worker 0 used to retire the real worker 0 and fail
// the job. A connection claiming an index that a live connection holds is refused instead, and
// the real worker goes on.
TEST(PsTest, AForgedHelloDoesNotDisplaceALiveWorker) {
  ps::ServerOptions so;
  so.listen_host = "127.0.0.1";
  ps::Server server(so);
  ps::ClientOptions co;
  co.servers = {server.address()};
  co.timeout = std::chrono::seconds(20);
  ps::Client real(co);
  std::vector<float> w(8, 1.0f), g(8, 0.5f);
  real.create_dense("w", TensorView::of(w), {});
  real.push_pull("w", TensorView::of(g), TensorView::of(w)).wait();

  const auto colon = server.address().rfind(':');
  const auto port = static_cast<uint16_t>(std::stoi(server.address().substr(colon + 1)));
  net::Fd forged = net::connect_tcp({"127.0.0.1", port}, Deadline::after(5s), "forger");
  net::handshake_connect(forged.get(), {"dtrain", ""},
                         net::Hello{net::Role::kPsClient, /*rank=*/0, /*peer_rank=*/0, /*tag=*/1},
                         0, Deadline::after(5s), "forger");
  // The server answers the forger with an error frame and closes: read until the end.
  std::string answer;
  char buf[4096];
  for (;;) {
    pollfd p{forged.get(), POLLIN, 0};
    if (::poll(&p, 1, 20'000) <= 0) break;
    ssize_t n = ::read(forged.get(), buf, sizeof(buf));
    if (n <= 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  EXPECT_NE(answer.find("a second connection claiming worker 0"), std::string::npos) << answer;
  // The real worker still works.
  for (int k = 0; k < 3; ++k) real.push_pull("w", TensorView::of(g), TensorView::of(w)).wait();
}

// Silent connections (port scanners, a stuck client) do not delay a real worker: each
// connection has its handshake on a thread of its own (they used to be served one by one, up to
// 10 s each), and beyond a cap per source host new ones are closed at once.
TEST(PsTest, SilentConnectionsDoNotDelayARealWorker) {
  ps::ServerOptions so;
  so.listen_host = "127.0.0.1";
  ps::Server server(so);
  const auto colon = server.address().rfind(':');
  const auto port = static_cast<uint16_t>(std::stoi(server.address().substr(colon + 1)));
  std::vector<net::Fd> silent;
  for (int i = 0; i < 40; ++i)
    silent.push_back(net::connect_tcp({"127.0.0.1", port}, Deadline::after(5s), "silent"));
  ps::ClientOptions co;
  co.servers = {server.address()};
  co.connect_timeout = std::chrono::seconds(20);
  const auto start = std::chrono::steady_clock::now();
  ps::Client real(co);
  std::vector<float> w(4, 1.0f);
  real.create_dense("w", TensorView::of(w), {});
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, 3s) << "40 silent connections delayed a real worker by "
                      << std::chrono::duration<double>(took).count() << " s";
}

// What is closed to make room is a silent connection, not one in mid-hello: a real worker
// sends its whole hello at once, so one that has spoken is closed last.
TEST(PsTest, ConnectionsThatSpokeAreNotClosedToMakeRoomForSilentOnes) {
  ps::ServerOptions so;
  so.listen_host = "127.0.0.1";
  ps::Server server(so);
  const auto colon = server.address().rfind(':');
  const net::HostPort at{"127.0.0.1",
                         static_cast<uint16_t>(std::stoi(server.address().substr(colon + 1)))};
  net::Fd speaking = net::connect_tcp(at, Deadline::after(5s), "speaking");
  const char part_of_a_hello[] = {'D', 'T'};
  ASSERT_EQ(::send(speaking.get(), part_of_a_hello, 2, 0), 2);
  std::this_thread::sleep_for(100ms);  // its thread has seen the bytes
  std::vector<net::Fd> silent;
  for (int i = 0; i < 40; ++i)
    silent.push_back(net::connect_tcp(at, Deadline::after(5s), "silent"));
  EXPECT_TRUE(closed_by_peer(silent.front().get(), 5s)) << "the oldest silent one is open";
  EXPECT_FALSE(closed_by_peer(speaking.get(), 300ms))
      << "the connection in mid-hello was closed to make room for silent ones";
}

// A server that advertises a loopback address, as one started by `dtrain run` for a job whose
// store is on 127.0.0.1, listens on loopback only (it listened on every interface); one told
// nothing listens on every interface, as `dtrain ps-server --host` documents.
TEST(PsTest, AServerAdvertisingLoopbackListensOnLoopbackOnly) {
  const std::string outside = non_loopback_ipv4();
  if (outside.empty()) GTEST_SKIP() << "this machine has no address but loopback";
  auto reachable = [](const std::string& host, const std::string& address) {
    const auto port = static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
    try {
      net::connect_tcp({host, port}, Deadline::after(300ms), "probe");
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  ps::ServerOptions local;
  local.advertise_host = "127.0.0.1";
  ps::Server loopback_only(local);
  EXPECT_TRUE(reachable("127.0.0.1", loopback_only.address()));
  EXPECT_FALSE(reachable(outside, loopback_only.address())) << "answered on " << outside;
  ps::Server everywhere(ps::ServerOptions{});
  EXPECT_TRUE(reachable(outside, everywhere.address())) << "silent on " << outside;
}

}  // namespace
}  // namespace dtrain::testing
