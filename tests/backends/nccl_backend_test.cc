// The nccl backend, and CUDA tensors on the native backend; built in every configuration, with
// what that configuration has:
//
// * with the nccl backend (CUDA toolkit and NCCL found): without a GPU (the machines CI runs
//   on), DTRAIN_BACKEND=nccl must fail at once with "backend nccl needs a CUDA device"; with
//   one, the shared suite (suite.h) runs on GPU memory through DeviceMirror, at world size 1
//   (2 with two GPUs), and host tensors go through the native group beside NCCL's.
// * with CUDA: without a GPU, a CUDA tensor handed to the native backend fails with a message
//   naming the rank and the operation, before anything is sent; with one, the suite runs on
//   the native backend with three ranks sharing one GPU, which NCCL cannot do.
// * without CUDA: a CUDA tensor fails with "dtrain was built without CUDA".
// Tests that need a GPU the machine lacks skip, saying why.
//
// CUDA is touched only inside forked children: a process that initialised CUDA cannot use it
// after a fork, so even the number of GPUs is asked of a child.
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#ifdef DTRAIN_TEST_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef DTRAIN_TEST_NCCL
#include <nccl.h>
#endif

#include "backends/suite.h"
#include "support/expect.h"
#include "support/multiproc.h"

namespace dtrain::testing::backends {
namespace {

using namespace std::chrono_literals;

// A line for docs/backends.md about what the tests could and could not run here
// (tools/backends_table.py prints the latest note of each backend).
void record_note(const std::string& backend, const std::string& note) {
  std::string escaped;
  for (char c : note) {
    if (c == '"' || c == '\\') escaped += '\\';
    escaped += c == '\n' ? ' ' : c;
  }
  ::mkdir(support_dir().c_str(), 0755);
  const std::string line = fmt::format(R"({{"backend": "{}", "note": "{}"}})"
                                       "\n",
                                       backend, escaped);
  const std::string path = fmt::format("{}/{}.jsonl", support_dir(), backend);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  [[maybe_unused]] auto n = ::write(fd, line.data(), line.size());
  ::close(fd);
}

#ifdef DTRAIN_TEST_CUDA

struct Gpus {
  int count = 0;
  std::string why_none;  // cudaGetDeviceCount's error when there is none
};

// How many GPUs a child process sees (cached).
const Gpus& gpus() {
  static const Gpus probed = [] {
    Gpus g;
    int fds[2];
    if (::pipe(fds) != 0) {
      g.why_none = "pipe() failed";
      return g;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      int n = 0;
      const cudaError_t e = cudaGetDeviceCount(&n);
      const std::string line =
          e == cudaSuccess
              ? fmt::format("{}|", n)
              : fmt::format("0|cudaGetDeviceCount returned {} ({}): {}", cudaGetErrorName(e),
                            static_cast<int>(e), cudaGetErrorString(e));
      [[maybe_unused]] auto written = ::write(fds[1], line.data(), line.size());
      ::_exit(0);
    }
    ::close(fds[1]);
    std::string text;
    pollfd p{fds[0], POLLIN, 0};
    char buf[512];
    while (::poll(&p, 1, 30'000) > 0) {
      const ssize_t k = ::read(fds[0], buf, sizeof(buf));
      if (k <= 0) break;
      text.append(buf, static_cast<size_t>(k));
    }
    ::close(fds[0]);
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    }
    const size_t bar = text.find('|');
    if (bar == std::string::npos) {
      g.why_none = "the child asking CUDA for its devices said nothing within 30 s";
      return g;
    }
    g.count = std::stoi(text.substr(0, bar));
    g.why_none = g.count > 0 ? "" : text.substr(bar + 1);
    if (g.count == 0 && g.why_none.empty()) g.why_none = "cudaGetDeviceCount found no device";
    return g;
  }();
  return probed;
}

// "CUDA runtime 13.0, NCCL 2.28.9"
std::string versions() {
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  std::string text = fmt::format("CUDA runtime {}.{}", runtime / 1000, runtime % 1000 / 10);
#ifdef DTRAIN_TEST_NCCL
  text += fmt::format(", NCCL {}.{}.{}", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
#endif
  return text;
}

// "1 GPU (NVIDIA H200)": called in a child that uses the GPU.
std::string which_gpus() {
  cudaDeviceProp prop{};
  const std::string name =
      cudaGetDeviceProperties(&prop, 0) == cudaSuccess ? prop.name : "name unknown";
  return fmt::format("{} GPU{} ({})", gpus().count, gpus().count == 1 ? "" : "s", name);
}

// ---- DeviceMirror: the suite's host buffers, as GPU memory ----

void cuda_ok(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess)
    throw std::runtime_error(fmt::format("test harness: {}: {}", what, cudaGetErrorString(e)));
}

// The Work of a mirrored call: once the group's Work completed, the outputs come back down.
class MirrorWork : public Work {
 public:
  struct Out {
    TensorView host;
    std::shared_ptr<void> device;
  };
  MirrorWork(std::shared_ptr<Work> inner, std::vector<Out> outs)
      : inner_(std::move(inner)), outs_(std::move(outs)) {}

  bool is_completed() override {
    if (!inner_->is_completed()) return false;
    back();
    return true;
  }
  void wait_until_done(std::optional<std::chrono::milliseconds> timeout) override {
    inner_->wait(timeout);
    back();
  }
  std::exception_ptr exception() const override { return inner_->exception(); }

 private:
  void back() {
    if (copied_ || inner_->exception()) return;
    copied_ = true;
    for (const auto& o : outs_)
      if (o.host.nbytes() > 0)
        cuda_ok(cudaMemcpy(o.host.data, o.device.get(), o.host.nbytes(), cudaMemcpyDeviceToHost),
                "copying an output back to the host");
  }
  std::shared_ptr<Work> inner_;
  std::vector<Out> outs_;
  bool copied_ = false;
};

// Runs a group under the suite, which reads and writes host buffers: every call copies its
// tensors to fresh GPU buffers, calls the group with CUDA views of them, and copies the outputs
// back when its Work completes. Not a mock: the group under test moves the GPU memory.
class DeviceMirror : public ProcessGroup {
 public:
  DeviceMirror(std::shared_ptr<ProcessGroup> inner, int device)
      : inner_(std::move(inner)), device_(device) {
    cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }

  std::shared_ptr<Work> isend(const TensorView& t, int dst, int tag,
                              const SendOptions& o) override {
    Call c(*this);
    return c.done(inner_->isend(c.up(t, false), dst, tag, o));
  }
  std::shared_ptr<Work> irecv(const TensorView& t, int src, int tag,
                              const RecvOptions& o) override {
    Call c(*this);
    return c.done(inner_->irecv(c.up(t, true), src, tag, o));
  }
  std::shared_ptr<Work> broadcast(const TensorView& t, const BroadcastOptions& o) override {
    Call c(*this);
    return c.done(inner_->broadcast(c.up(t, true), o));
  }
  std::shared_ptr<Work> allreduce(const TensorView& t, const AllreduceOptions& o) override {
    Call c(*this);
    return c.done(inner_->allreduce(c.up(t, true), o));
  }
  using ProcessGroup::allreduce;
  std::shared_ptr<Work> reduce(const TensorView& t, const ReduceOptions& o) override {
    Call c(*this);
    return c.done(inner_->reduce(c.up(t, true), o));
  }
  std::shared_ptr<Work> allgather(const TensorView& out, const TensorView& in,
                                  const AllgatherOptions& o) override {
    Call c(*this);
    return c.done(inner_->allgather(c.up(out, true), c.up(in, false), o));
  }
  std::shared_ptr<Work> allgatherv(const TensorView& out, const TensorView& in,
                                   const std::vector<size_t>& counts,
                                   const AllgatherOptions& o) override {
    Call c(*this);
    return c.done(inner_->allgatherv(c.up(out, true), c.up(in, false), counts, o));
  }
  std::shared_ptr<Work> gather(const TensorView& out, const TensorView& in,
                               const GatherOptions& o) override {
    Call c(*this);
    return c.done(inner_->gather(c.up(out, true), c.up(in, false), o));
  }
  std::shared_ptr<Work> scatter(const TensorView& out, const TensorView& in,
                                const ScatterOptions& o) override {
    Call c(*this);
    return c.done(inner_->scatter(c.up(out, true), c.up(in, false), o));
  }
  std::shared_ptr<Work> reduce_scatter(const TensorView& out, const TensorView& in,
                                       const ReduceScatterOptions& o) override {
    Call c(*this);
    return c.done(inner_->reduce_scatter(c.up(out, true), c.up(in, false), o));
  }
  std::shared_ptr<Work> alltoall(const TensorView& out, const TensorView& in,
                                 const AlltoallOptions& o) override {
    Call c(*this);
    return c.done(inner_->alltoall(c.up(out, true), c.up(in, false), o));
  }
  std::shared_ptr<Work> alltoallv(const TensorView& out, const std::vector<size_t>& out_counts,
                                  const TensorView& in, const std::vector<size_t>& in_counts,
                                  const AlltoallOptions& o) override {
    Call c(*this);
    return c.done(inner_->alltoallv(c.up(out, true), out_counts, c.up(in, false), in_counts, o));
  }
  std::shared_ptr<Work> barrier(const BarrierOptions& o) override { return inner_->barrier(o); }
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override {
    auto g = inner_->new_group(ranks);
    return g ? std::make_shared<DeviceMirror>(std::move(g), device_) : nullptr;
  }
  void abort(const std::string& reason) override { inner_->abort(reason); }

 private:
  // The GPU copies of one call's tensors.
  class Call {
   public:
    explicit Call(DeviceMirror& m) : m_(m) {}
    TensorView up(const TensorView& host, bool output) {
      std::shared_ptr<void> dev;
      if (host.nbytes() > 0) {
        void* p = nullptr;
        cuda_ok(cudaMalloc(&p, host.nbytes()), "cudaMalloc");
        dev.reset(p, [](void* q) { cudaFree(q); });
        cuda_ok(cudaMemcpy(p, host.data, host.nbytes(), cudaMemcpyHostToDevice),
                "copying a tensor to the GPU");
      }
      kept_.push_back(dev);
      if (output) outs_.push_back({host, dev});
      return TensorView{dev.get(), host.numel, host.dtype, Device::kCuda, m_.device_};
    }
    std::shared_ptr<Work> done(std::shared_ptr<Work> inner) {
      // The inputs' GPU buffers must outlive the operation too: the outputs' list keeps them.
      for (auto& k : kept_) outs_.push_back({TensorView{}, k});
      return std::make_shared<MirrorWork>(std::move(inner), std::move(outs_));
    }

   private:
    DeviceMirror& m_;
    std::vector<std::shared_ptr<void>> kept_;
    std::vector<MirrorWork::Out> outs_;
  };

  std::shared_ptr<ProcessGroup> inner_;
  int device_;
};

#endif  // DTRAIN_TEST_CUDA

#ifndef DTRAIN_TEST_CUDA

// ---- a build without CUDA ----

TEST(NativeBackend, CudaTensorRefusedInABuildWithoutCuda) {
  const int port = free_port();
  expect_all_ok(run_ranks(
      2,
      [&](int rank) {
        auto pg = make_group(rank, 2, port, {.backend = "native"});
        std::vector<float> host(8, 1.0f);
        TensorView cuda{host.data(), host.size(), DType::kF32, Device::kCuda, 0};
        try {
          pg->allreduce(cuda);
          throw std::runtime_error("a build without CUDA took a CUDA tensor");
        } catch (const InvalidArgumentError& e) {
          const std::string text = e.what();
          if (rank == 0) std::printf("the refusal reads: %s\n", text.c_str());
          RANK_CHECK(text.find(fmt::format("rank {}: all_reduce: backend native does not support "
                                           "all_reduce on CUDA tensors: dtrain was built without "
                                           "CUDA",
                                           rank)) != std::string::npos,
                     "{}", text);
        }
        // Nothing was sent: the group still works.
        std::vector<int32_t> v(100, rank + 1);
        pg->allreduce(TensorView::of(v))->wait();
        for (int x : v) RANK_CHECK(x == 3, "all_reduce after the refusal gave {}", x);
        if (rank == 0)
          record_note("native",
                      "CUDA tensors: this build has no CUDA; the tests checked that a "
                      "CUDA tensor fails with \"dtrain was built without CUDA\"");
      },
      60s));
}

#endif  // !DTRAIN_TEST_CUDA

#ifdef DTRAIN_TEST_NCCL

// ---- nccl ----

TEST(NcclBackend, WithoutAGpuCreatingTheGroupFailsAtOnce) {
  if (gpus().count > 0)
    GTEST_SKIP() << gpus().count << " GPUs visible: the GPU tests below cover this machine";
  // A file store: the refusal comes before any rendezvous, so no rank needs another one.
  const std::string store_path = ::testing::TempDir() + "/nccl_without_gpu_store";
  ::unlink(store_path.c_str());
  expect_all_ok(run_ranks(
      2,
      [&](int rank) {
        ::setenv("DTRAIN_BACKEND", "nccl", 1);
        auto store = std::make_shared<FileStore>(store_path, 20s);
        const auto start = std::chrono::steady_clock::now();
        std::string text;
        try {
          ProcessGroup::create(store, rank, 2, {.timeout = 30s, .connect_timeout = 30s});
          throw std::runtime_error("an nccl group was created on a machine without a GPU");
        } catch (const InvalidArgumentError& e) {
          text = e.what();
          RANK_CHECK(!e.retryable(), "a missing GPU is no reason to retry: {}", text);
        }
        std::printf("the refusal reads: %s\n", text.c_str());
        const auto took = std::chrono::steady_clock::now() - start;
        RANK_CHECK(text.find(fmt::format("rank {}: backend nccl needs a CUDA device: "
                                         "cudaGetDeviceCount returned",
                                         rank)) != std::string::npos,
                   "the error does not say what is missing: {}", text);
        RANK_CHECK(text.find("DTRAIN_BACKEND=native") != std::string::npos,
                   "the error does not say what to use instead: {}", text);
        // Before any rendezvous: not after the 30 s connect timeout.
        RANK_CHECK(took < 5s, "the refusal took {} ms",
                   std::chrono::duration_cast<std::chrono::milliseconds>(took).count());
        if (rank == 0)
          record_note(
              "nccl",
              fmt::format(
                  "compiled and linked ({}), but no GPU was visible to the tests ({}): they "
                  "checked that DTRAIN_BACKEND=nccl fails at once with \"backend nccl needs a "
                  "CUDA device\"; no GPU path ran here (collectives, send/recv, sub-groups, "
                  "timeouts)",
                  versions(), gpus().why_none));
      },
      60s));
}

TEST(NcclBackend, HostTensorsGoThroughTheNativeGroupBesideIt) {
  if (gpus().count == 0)
    GTEST_SKIP() << "no GPU (" << gpus().why_none
                 << "): an nccl group cannot be created here, so its routing cannot be reached";
  const int port = free_port();
  expect_all_ok(run_ranks(
      1,
      [&](int rank) {
        auto pg = make_group(rank, 1, port, {.backend = "nccl"});
        std::vector<float> a = {1, 2, 3, 4}, b(4);
        const TensorView x = TensorView::of(a), y = TensorView::of(b);
        std::vector<size_t> counts{4};
        const std::vector<std::pair<std::string, std::function<void()>>> ops = {
            {"all_reduce", [&] { pg->allreduce(x)->wait(); }},
            {"broadcast", [&] { pg->broadcast(x)->wait(); }},
            {"reduce", [&] { pg->reduce(x)->wait(); }},
            {"all_gather", [&] { pg->allgather(y, x)->wait(); }},
            {"all_gather_v", [&] { pg->allgatherv(y, x, counts)->wait(); }},
            {"gather", [&] { pg->gather(y, x)->wait(); }},
            {"scatter", [&] { pg->scatter(y, x)->wait(); }},
            {"reduce_scatter", [&] { pg->reduce_scatter(y, x)->wait(); }},
            {"all_to_all", [&] { pg->alltoall(y, x)->wait(); }},
            {"all_to_all_v", [&] { pg->alltoallv(y, counts, x, counts)->wait(); }},
        };
        for (const auto& [op, f] : ops) {
          std::fill(b.begin(), b.end(), 0.0f);
          f();
          // A world of one: every operation leaves the values as they were, or copies them.
          RANK_CHECK(a == std::vector<float>({1, 2, 3, 4}), "{}: the input changed", op);
          if (op != "all_reduce" && op != "broadcast" && op != "reduce")
            RANK_CHECK(b == a, "{}: the output is not the input", op);
          record("nccl", op, "cpu", "", true);
        }
        // One call's tensors on one side: a host tensor beside a CUDA one is refused.
        float* device = nullptr;
        RANK_CHECK(cudaMalloc(&device, 4 * sizeof(float)) == cudaSuccess, "cudaMalloc");
        TensorView on_gpu{device, 4, DType::kF32, Device::kCuda, 0};
        try {
          pg->allgather(on_gpu, x);
          RANK_CHECK(false, "a CUDA output beside a host input was taken");
        } catch (const InvalidArgumentError& e) {
          const std::string text = e.what();
          RANK_CHECK(text.find("one tensor is on cuda:0, another on the host") != std::string::npos,
                     "{}", text);
        }
        cudaFree(device);
      },
      120s));
}

TEST(NcclBackend, SuiteOnTheGpuAtWorldSizeOne) {
  if (gpus().count == 0) GTEST_SKIP() << "no GPU: " << gpus().why_none;
  const int port = free_port();
  expect_all_ok(run_ranks(
      1,
      [&](int rank) {
        auto pg = make_group(rank, 1, port, {.backend = "nccl"});
        DeviceMirror gpu(pg, 0);
        Suite suite{gpu, "nccl", true, "cuda"};
        suite.reductions(counts_for(1));
        suite.movement(counts_for(1));
        suite.subgroups();
        record_note("nccl", fmt::format("ran on {}, {}", which_gpus(), versions()));
      },
      240s));
}

TEST(NcclBackend, TwoRanksOnTwoGpus) {
  if (gpus().count < 2)
    GTEST_SKIP() << "needs two GPUs, this machine has " << gpus().count << " " << gpus().why_none;
  const int port = free_port();
  expect_all_ok(run_ranks(
      2,
      [&](int rank) {
        ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
        auto pg = make_group(rank, 2, port, {.backend = "nccl"});
        DeviceMirror mirror(pg, rank);
        ProcessGroup& gpu = mirror;  // the interface, with its default arguments
        Suite suite{gpu, "nccl", rank == 0, "cuda"};
        suite.reductions(counts_for(2));
        suite.movement(counts_for(2));
        suite.subgroups();
        // An exchange, both ranks receiving first: separate channels per direction.
        std::vector<float> mine(1000, float(rank + 1)), theirs(1000, 0.0f);
        auto r = gpu.irecv(TensorView::of(theirs), 1 - rank);
        auto s = gpu.isend(TensorView::of(mine), 1 - rank);
        s->wait();
        r->wait();
        for (float v : theirs) RANK_CHECK(v == float(2 - rank), "received {}", v);
        suite.note("send_recv", "cpu", "", true);
        // A collective one rank never joins: a TimeoutError that names all, then an unusable group.
        if (rank == 0) {
          std::vector<float> x(256, 1.0f);
          try {
            gpu.allreduce(TensorView::of(x), {.timeout = 1s})->wait();
            throw std::runtime_error("an all_reduce rank 1 never called completed");
          } catch (const TimeoutError& e) {
            const std::string text = e.what();
            for (const char* part : {"rank 0", "all_reduce", "collective #", "1024 bytes", "limit"})
              RANK_CHECK(text.find(part) != std::string::npos, "'{}' missing from: {}", part, text);
          }
          try {
            gpu.barrier()->wait();
            throw std::runtime_error(
                "the group was still usable after its communicator was aborted");
          } catch (const Error& e) {
            RANK_CHECK(std::string(e.what()).find("unusable") != std::string::npos, "{}", e.what());
          }
          pg->abort("test over");
        } else {
          std::this_thread::sleep_for(3s);
        }
      },
      240s));
}

#endif  // DTRAIN_TEST_NCCL

#ifdef DTRAIN_TEST_CUDA

// ---- native, CUDA tensors ----

TEST(NativeBackend, CudaTensorWithoutAGpuFailsAndSendsNothing) {
  if (gpus().count > 0)
    GTEST_SKIP() << gpus().count << " GPUs visible: NativeBackend.CudaTensorsThroughHostMemory "
                 << "covers this machine";
  const int port = free_port();
  expect_all_ok(run_ranks(
      2,
      [&](int rank) {
        auto pg = make_group(rank, 2, port, {.backend = "native"});
        std::vector<float> host(8, 1.0f);
        // What a program without a GPU might build by mistake: a host buffer labelled CUDA.
        TensorView cuda{host.data(), host.size(), DType::kF32, Device::kCuda, 0};
        for (const char* op : {"all_reduce", "broadcast", "all_gather"}) {
          std::vector<float> out(8 * 2);
          TensorView cuda_out{out.data(), out.size(), DType::kF32, Device::kCuda, 0};
          try {
            if (std::string(op) == "all_reduce") pg->allreduce(cuda);
            if (std::string(op) == "broadcast") pg->broadcast(cuda);
            if (std::string(op) == "all_gather") pg->allgather(cuda_out, cuda);
            throw std::runtime_error(fmt::format("{} took a CUDA tensor without a GPU", op));
          } catch (const InvalidArgumentError& e) {
            const std::string text = e.what();
            if (rank == 0) std::printf("the refusal reads: %s\n", text.c_str());
            RANK_CHECK(
                text.find(fmt::format("rank {}: {}", rank, op)) != std::string::npos &&
                    text.find("cuda:0") != std::string::npos &&
                    text.find("no usable GPU") != std::string::npos,
                "the error does not name the rank, the operation, the device and the cause: {}",
                text);
          }
        }
        // Nothing was sent: the group still works, in step on both ranks.
        std::vector<int32_t> v(100, rank + 1);
        pg->allreduce(TensorView::of(v))->wait();
        for (int x : v) RANK_CHECK(x == 3, "all_reduce after the refusals gave {}", x);
        if (rank == 0)
          record_note("native",
                      fmt::format("CUDA tensors: compiled and linked ({}), but no GPU was visible "
                                  "to the tests: they checked that a CUDA tensor fails with a "
                                  "message naming the rank, the operation and the cause, before "
                                  "anything is sent; the staging through pinned host memory did "
                                  "not run here",
                                  versions()));
      },
      60s));
}

TEST(NativeBackend, CudaTensorsThroughHostMemory) {
  if (gpus().count == 0) GTEST_SKIP() << "no GPU: " << gpus().why_none;
  const int n = 3;  // three ranks on one GPU: what NCCL refuses and the native backend does
  const int port = free_port();
  expect_all_ok(run_ranks(
      n,
      [&](int rank) {
        auto pg = make_group(rank, n, port, {.backend = "native"});
        DeviceMirror mirror(pg, 0);
        ProcessGroup& gpu = mirror;  // the interface, with its default arguments
        Suite suite{gpu, "native", rank == 0, "cuda"};
        suite.all(counts_for(n));
        // One rank's tensor on the GPU, the others' on the host: still one collective each.
        std::vector<int32_t> v(4099, rank + 1);
        auto w = rank == 0 ? gpu.allreduce(TensorView::of(v)) : pg->allreduce(TensorView::of(v));
        w->wait();
        for (int x : v) RANK_CHECK(x == 6, "mixed all_reduce gave {}", x);
        if (rank == 0)
          record_note("native", fmt::format("CUDA tensors ran on {}, {}, three ranks sharing "
                                            "one GPU",
                                            which_gpus(), versions()));
      },
      240s));
}

#endif  // DTRAIN_TEST_CUDA

}  // namespace
}  // namespace dtrain::testing::backends
