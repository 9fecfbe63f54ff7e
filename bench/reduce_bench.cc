// reduce_into throughput (SUM over f32, f16, bf16) against a plain memcpy of the same buffer size.
// Run:    build-reduce/bin/reduce_bench --benchmark_repetitions=3
// --benchmark_report_aggregates_only=true Prints: per dtype and size (4 KiB, 1 MiB, 64 MiB), time
// per call and bytes_per_second, where the
//         bytes are one buffer's size (reduce_into reads two buffers and writes one, memcpy reads
//         one and writes one), so the two columns compare what a collective gets per call.
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "common/reduce.h"

namespace dtrain {
namespace {

constexpr int64_t kSizes[] = {4 << 10, 1 << 20, 64 << 20};

void apply_sizes(benchmark::internal::Benchmark* b) {
  for (int64_t size : kSizes) b->Arg(size);
}

void bm_memcpy(benchmark::State& state) {
  size_t nbytes = static_cast<size_t>(state.range(0));
  std::vector<std::byte> src(nbytes, std::byte{1}), dst(nbytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), nbytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(nbytes));
}

void bm_reduce_into(benchmark::State& state, DType dtype) {
  size_t nbytes = static_cast<size_t>(state.range(0));
  size_t count = nbytes / element_size(dtype);
  // Small normal values: the sum grows slowly and never reaches subnormals or infinity.
  std::vector<float> init(count, 1e-3f);
  std::vector<std::byte> dst(nbytes), src(nbytes);
  if (dtype == DType::kF32) std::memcpy(src.data(), init.data(), nbytes);
  if (dtype == DType::kF16) f32_to_f16(init.data(), reinterpret_cast<uint16_t*>(src.data()), count);
  if (dtype == DType::kBF16)
    f32_to_bf16(init.data(), reinterpret_cast<uint16_t*>(src.data()), count);
  for (auto _ : state) {
    reduce_into(dst.data(), src.data(), count, dtype, ReduceOp::kSum);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(nbytes));
}

BENCHMARK(bm_memcpy)->Apply(apply_sizes);
BENCHMARK_CAPTURE(bm_reduce_into, f32_sum, DType::kF32)->Apply(apply_sizes);
BENCHMARK_CAPTURE(bm_reduce_into, f16_sum, DType::kF16)->Apply(apply_sizes);
BENCHMARK_CAPTURE(bm_reduce_into, bf16_sum, DType::kBF16)->Apply(apply_sizes);

}  // namespace
}  // namespace dtrain

BENCHMARK_MAIN();
