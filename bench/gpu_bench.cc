// gpu_bench: dtrain's GPU paths against their floors, on one GPU, in one run (alternating rounds,
// medians and ratios, as every dtrain benchmark):
//
//   allreduce  in-place f32 sum through dtrain's nccl backend against NCCL called directly on its
//              own communicator (the peer), world size 1 (one GPU allows no more for NCCL). Two
//              ways each: "sync", a call waited for before the next (what a training step
//              does), and "pipelined", `iters` calls issued and the last one waited for (what
//              nccl-tests times).
//   staging    the native backend's all_reduce of a CUDA tensor (copied into pinned host memory,
//              reduced, copied back) against its floor: a plain copy of the same bytes to pinned
//              host memory and back (cudaMemcpyAsync both ways), and beside it the same call on
//              a CPU tensor (what the call costs without the copies) and one plain device-to-host
//              copy.
//
// Every result is checked: all-reduce on a world of one leaves the values as they were.
// Usage: gpu_bench [--rounds R] [--iters N] [--json FILE]; prints a table and, with --json, one
// JSON object per line. Built only with the nccl backend (bench/CMakeLists.txt).
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dtrain/process_group.h"
#include "dtrain/store.h"

namespace {

using Clock = std::chrono::steady_clock;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(fmt::format("gpu_bench: {}: {}", what, cudaGetErrorString(e)));
}
void nccl_ok(ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    throw std::runtime_error(fmt::format("gpu_bench: {}: {}", what, ncclGetErrorString(r)));
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string size_label(size_t bytes) {
  if (bytes >= (size_t{1} << 30) && bytes % (size_t{1} << 30) == 0)
    return fmt::format("{}G", bytes >> 30);
  if (bytes >= (size_t{1} << 20) && bytes % (size_t{1} << 20) == 0)
    return fmt::format("{}M", bytes >> 20);
  if (bytes >= 1024 && bytes % 1024 == 0) return fmt::format("{}K", bytes >> 10);
  return fmt::format("{}", bytes);
}

// Seconds per operation of `iters` calls of `op` (after `warmup`), `finish` ending each timed
// call ("sync") or only the last ("pipelined").
double time_per_op(int warmup, int iters, const std::function<void()>& op,
                   const std::function<void()>& finish, bool each) {
  for (int i = 0; i < warmup; ++i) {
    op();
    finish();
  }
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) {
    op();
    if (each) finish();
  }
  if (!each) finish();
  return std::chrono::duration<double>(Clock::now() - start).count() / iters;
}

struct Row {
  std::string part, impl, mode;
  size_t bytes;
  std::vector<double> seconds;  // one per round
};

struct Args {
  int rounds = 5;
  int iters = 20;
  std::string json;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument("gpu_bench: " + k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--rounds") a.rounds = std::stoi(v);
    else if (k == "--iters") a.iters = std::stoi(v);
    else if (k == "--json") a.json = v;
    else throw std::invalid_argument("gpu_bench: unknown option " + k +
                                     " (usage: gpu_bench [--rounds R] [--iters N] [--json FILE])");
  }
  if (a.rounds < 1 || a.iters < 1) throw std::invalid_argument("gpu_bench: rounds and iters >= 1");
  return a;
}

// A world of one for `backend`, on a file store of its own.
std::shared_ptr<dtrain::ProcessGroup> world_of_one(const std::string& backend) {
  const std::string path = fmt::format("/tmp/gpu_bench_store_{}_{}", backend, ::getpid());
  ::unlink(path.c_str());
  auto store = std::make_shared<dtrain::FileStore>(path, std::chrono::seconds(60));
  dtrain::ProcessGroupOptions o;
  o.backend = backend;
  o.name = backend;
  o.timeout = std::chrono::seconds(60);
  o.connect_timeout = std::chrono::seconds(60);
  return dtrain::ProcessGroup::create(store, 0, 1, o);
}

// Device buffer of `count` floats holding i % 251, and a check that it still does.
struct DeviceFloats {
  explicit DeviceFloats(size_t count) : count(count), host(count) {
    for (size_t i = 0; i < count; ++i) host[i] = float(i % 251);
    cuda_ok(cudaMalloc(&data, count * sizeof(float)), "cudaMalloc");
    cuda_ok(cudaMemcpy(data, host.data(), count * sizeof(float), cudaMemcpyHostToDevice), "upload");
  }
  ~DeviceFloats() { cudaFree(data); }
  void check(const std::string& who) {
    std::vector<float> back(count);
    cuda_ok(cudaMemcpy(back.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost), "download");
    for (size_t i = 0; i < count; ++i)
      if (back[i] != host[i])
        throw std::runtime_error(fmt::format("gpu_bench: {} changed element {}: {} instead of {}",
                                             who, i, back[i], host[i]));
  }
  size_t count;
  std::vector<float> host;
  void* data = nullptr;
};

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
  int device_count = 0;
  cuda_ok(cudaGetDeviceCount(&device_count), "cudaGetDeviceCount");
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int runtime = 0, driver = 0, nccl_version = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  ncclGetVersion(&nccl_version);
  std::printf("gpu_bench on %s (%d GPUs), CUDA runtime %d, driver %d, NCCL %d; %d rounds of %d "
              "iterations\n", prop.name, device_count, runtime, driver, nccl_version, args.rounds,
              args.iters);
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");

  std::vector<Row> rows;
  auto row = [&](const std::string& part, const std::string& impl, const std::string& mode,
                 size_t bytes) -> Row& {
    for (auto& r : rows)
      if (r.part == part && r.impl == impl && r.mode == mode && r.bytes == bytes) return r;
    rows.push_back({part, impl, mode, bytes, {}});
    return rows.back();
  };

  // ---- all_reduce: dtrain's nccl backend against NCCL itself ----
  {
    auto pg = world_of_one("nccl");
    ncclUniqueId id;
    nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
    ncclComm_t comm;
    nccl_ok(ncclCommInitRank(&comm, 1, id, 0), "ncclCommInitRank");
    cudaStream_t stream;
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    const std::vector<size_t> sizes = {size_t{4} << 10, size_t{64} << 10, size_t{1} << 20,
                                       size_t{16} << 20, size_t{256} << 20, size_t{1} << 30};
    for (size_t bytes : sizes) {
      DeviceFloats buf(bytes / sizeof(float));
      const dtrain::TensorView view{buf.data, buf.count, dtrain::DType::kF32, dtrain::Device::kCuda, 0};
      std::shared_ptr<dtrain::Work> last;
      auto dtrain_op = [&] { last = pg->allreduce(view); };
      auto dtrain_finish = [&] { last->wait(); };
      auto nccl_op = [&] {
        nccl_ok(ncclAllReduce(buf.data, buf.data, buf.count, ncclFloat, ncclSum, comm, stream),
                "ncclAllReduce");
      };
      auto nccl_finish = [&] { cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); };
      for (int round = 0; round < args.rounds; ++round) {
        for (int k = 0; k < 2; ++k) {
          const bool dtrain_first = round % 2 == 0;
          const bool run_dtrain = (k == 0) == dtrain_first;
          for (bool each : {true, false}) {
            const double s = run_dtrain
                                 ? time_per_op(3, args.iters, dtrain_op, dtrain_finish, each)
                                 : time_per_op(3, args.iters, nccl_op, nccl_finish, each);
            row("allreduce", run_dtrain ? "dtrain-nccl" : "nccl", each ? "sync" : "pipelined", bytes)
                .seconds.push_back(s);
          }
        }
      }
      buf.check("all_reduce on a world of one");
    }
    cuda_ok(cudaStreamDestroy(stream), "cudaStreamDestroy");
    ncclCommDestroy(comm);
  }

  // ---- staging: the native backend's CUDA tensors against plain copies ----
  {
    auto pg = world_of_one("native");
    cudaStream_t stream;
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    const std::vector<size_t> sizes = {size_t{4} << 10, size_t{64} << 10, size_t{1} << 20,
                                       size_t{16} << 20, size_t{256} << 20};
    for (size_t bytes : sizes) {
      DeviceFloats buf(bytes / sizeof(float));
      std::vector<float> cpu(buf.host);
      void* pinned = nullptr;
      cuda_ok(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault), "cudaHostAlloc");
      const dtrain::TensorView gpu_view{buf.data, buf.count, dtrain::DType::kF32,
                                        dtrain::Device::kCuda, 0};
      const dtrain::TensorView cpu_view = dtrain::TensorView::of(cpu);
      std::shared_ptr<dtrain::Work> last;
      std::map<std::string, std::function<void()>> ops = {
          {"dtrain-native-cuda", [&] { last = pg->allreduce(gpu_view); }},
          {"dtrain-native-cpu", [&] { last = pg->allreduce(cpu_view); }},
          {"copy-d2h-h2d",
           [&] {
             cuda_ok(cudaMemcpyAsync(pinned, buf.data, bytes, cudaMemcpyDeviceToHost, stream), "d2h");
             cuda_ok(cudaMemcpyAsync(buf.data, pinned, bytes, cudaMemcpyHostToDevice, stream), "h2d");
           }},
          {"copy-d2h",
           [&] {
             cuda_ok(cudaMemcpyAsync(pinned, buf.data, bytes, cudaMemcpyDeviceToHost, stream), "d2h");
           }},
      };
      const std::function<void()> finish_work = [&] { last->wait(); };
      const std::function<void()> finish_copy = [&] {
        cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      };
      std::vector<std::string> forward;
      for (auto& [name, f] : ops) forward.push_back(name);
      for (int round = 0; round < args.rounds; ++round) {
        std::vector<std::string> order = forward;  // odd rounds run the other way round
        if (round % 2) std::reverse(order.begin(), order.end());
        for (const auto& name : order) {
          const bool is_copy = name.starts_with("copy");
          const double s = time_per_op(3, args.iters, ops[name], is_copy ? finish_copy : finish_work,
                                       true);
          row("staging", name, "sync", bytes).seconds.push_back(s);
        }
      }
      buf.check("native all_reduce of a CUDA tensor on a world of one");
      cuda_ok(cudaFreeHost(pinned), "cudaFreeHost");
    }
    cuda_ok(cudaStreamDestroy(stream), "cudaStreamDestroy");
  }

  // ---- report: medians over rounds, and the ratio to the floor of each part ----
  std::FILE* json = args.json.empty() ? nullptr : std::fopen(args.json.c_str(), "w");
  if (!args.json.empty() && !json)
    throw std::runtime_error(fmt::format("gpu_bench: cannot write {}: {}", args.json,
                                         std::strerror(errno)));
  auto floor_of = [&](const Row& r) -> const Row* {
    const std::string base = r.part == "allreduce" ? "nccl" : "copy-d2h-h2d";
    for (const auto& o : rows)
      if (o.part == r.part && o.impl == base && o.mode == r.mode && o.bytes == r.bytes) return &o;
    return nullptr;
  };
  std::printf("\n%-10s %-20s %-10s %8s %12s %10s %16s\n", "part", "impl", "mode", "size",
              "median us", "GB/s", "x floor (median)");
  for (const auto& r : rows) {
    const double us = median(r.seconds) * 1e6;
    const Row* f = floor_of(r);
    const double ratio = f ? us / (median(f->seconds) * 1e6) : 0;
    std::printf("%-10s %-20s %-10s %8s %12.1f %10.2f %16.2f\n", r.part.c_str(), r.impl.c_str(),
                r.mode.c_str(), size_label(r.bytes).c_str(), us, r.bytes / (us * 1e3), ratio);
    if (json)
      std::fprintf(json,
                   "{\"device\": \"%s\", \"part\": \"%s\", \"impl\": \"%s\", \"mode\": \"%s\", "
                   "\"bytes\": %zu, \"median_us\": %.3f, \"ratio_to_floor\": %.3f, \"rounds\": %zu}\n",
                   prop.name, r.part.c_str(), r.impl.c_str(), r.mode.c_str(), r.bytes, us, ratio,
                   r.seconds.size());
  }
  if (json && std::fclose(json) != 0)
    throw std::runtime_error(fmt::format("gpu_bench: writing {}: {}", args.json, std::strerror(errno)));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
