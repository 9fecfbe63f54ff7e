// What every implementation measured by `dtrain bench` shares, so that dtrain, Gloo and MPI are
// timed, checked and reported alike: the collectives and their buffer layouts (as nccl-tests
// define them), the input values and the expected results, the timing loop, statistics, bus
// bandwidth factors and the JSON line each run prints. bench/peers/torch_peer.py mirrors it in
// Python; a change here must be made there too.
//
// Depends on nothing of dtrain itself, so that a peer links only what it measures.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::bench {

enum class Collective {
  kAllreduce,
  kBroadcast,
  kReduce,
  kAllgather,
  kGather,
  kScatter,
  kReduceScatter,
  kAlltoall,
  kBarrier,
  kSendRecv,
};
// Element types and reduction operators the benchmark can check exactly.
enum class ElemType { kF32, kF64, kI32, kI64 };
enum class Op { kSum, kProd, kMin, kMax };

std::string_view to_string(Collective c);
std::string_view to_string(ElemType t);
std::string_view to_string(Op op);
// Each throws std::invalid_argument naming the accepted values.
Collective parse_collective(std::string_view name);
ElemType parse_elem_type(std::string_view name);
Op parse_op(std::string_view name);
const std::vector<Collective>& all_collectives();
bool is_reduction(Collective c);
size_t elem_size(ElemType t);

// "4K,64K,1M,16M" (K/M/G are powers of 1024, a trailing B is allowed) and ranges "4K:64M" that
// double from the first to the last. Throws std::invalid_argument on a malformed entry.
std::vector<size_t> parse_sizes(std::string_view text);
// 65536 -> "64K"; for labels.
std::string format_bytes(size_t bytes);

// The buffers of one rank, nccl-tests style. `bytes` is the size column: the larger of the input
// and output buffers of a rank (allgather/gather: the whole output; reducescatter/scatter: the
// whole input; alltoall: either). Requests are rounded down to whole elements and, for the
// collectives cut into per-rank blocks, to a multiple of `nranks` elements.
struct Layout {
  size_t bytes = 0;      // size column
  size_t count = 0;      // count column: bytes / element size
  size_t in_count = 0;   // elements of the input buffer
  size_t out_count = 0;  // elements of the output buffer (0 when the collective is in place)
  size_t block = 0;      // elements per rank block (the whole buffer for unblocked collectives)
};
Layout layout_for(Collective c, size_t requested_bytes, int nranks, ElemType t);

// busbw = algbw * factor (nccl-tests doc/PERFORMANCE.md): allreduce 2(n-1)/n; reducescatter,
// allgather, alltoall, gather, scatter (n-1)/n; broadcast, reduce, sendrecv 1; barrier 0.
double busbw_factor(Collective c, int nranks);

// The value rank `rank` puts at element `index` of its input: small integers, so that sums and
// products over many ranks stay exact in f32. SUM/MIN/MAX use ((5 rank + 3 index) mod 17) - 8;
// PROD uses -1 when (rank + index) is a multiple of 3, else 1.
double input_value(Op op, int rank, size_t index);
// Fills `count` elements of type t at `data` with input_value(op, rank, 0..count-1).
void fill_input(ElemType t, Op op, int rank, void* data, size_t count);
// Counts the elements of this rank's output that differ from what collective `c` must produce
// (root 0; reduce and gather check only at the root; sendrecv receives from rank - 1).
uint64_t count_wrong(Collective c, ElemType t, Op op, int rank, int nranks, const Layout& layout,
                     const void* output);

// One rank's buffers for one size. In place (`in_place`), the output is the input buffer.
// restore() puts the pristine input back when the op overwrites it (in place), outside the timed
// region, so that every iteration reduces the same values; with `poison` it also fills a separate
// output with a value no check expects, so that an op that writes nothing cannot pass.
class Buffers {
 public:
  Buffers(Collective c, ElemType t, Op op, int rank, int nranks, const Layout& layout,
          bool in_place);
  void* input() { return input_.data(); }
  void* output() { return in_place_ ? input_.data() : output_.data(); }
  void restore(bool poison);

 private:
  std::vector<std::byte> input_;
  std::vector<std::byte> pristine_;
  std::vector<std::byte> output_;
  bool in_place_;
};

// How an implementation takes part in the common timing loop.
struct Hooks {
  std::function<void()> prepare;                 // before each op, untimed; may be empty
  std::function<void()> prepare_check;           // before the checked op; empty = prepare
  std::function<void()> barrier;                 // every rank
  std::function<void()> run;                     // the op being measured
  std::function<double(double)> max_over_ranks;  // every rank gets the maximum
  std::function<double(double)> sum_over_ranks;  // every rank gets the sum
  std::function<double()> now;                   // seconds; empty = steady_clock
  std::function<uint64_t()> check;               // this rank's wrong elements; empty = no check
  // With straggle_seconds > 0, the straggler rank sleeps that long inside every timed op, and
  // the other ranks' CPU time (user + sys of the whole process) while they wait is recorded:
  // what waiting on a slow peer costs the cores training needs.
  double straggle_seconds = 0;
  bool straggler = false;  // this rank is the slow one
};

struct Measurement {
  std::vector<double> seconds;           // per timed iteration: the slowest rank's time
  std::vector<double> wait_cpu_seconds;  // per timed iteration: mean CPU of the waiting ranks
  uint64_t wrong = 0;                    // summed over ranks (0 when unchecked)
  bool checked = false;
};

// `warmup` untimed iterations; then, when hooks.check is set, one checked iteration; then `iters`
// timed iterations: prepare, barrier, time the op, max over ranks (outside the timed region).
Measurement measure(const Hooks& hooks, int warmup, int iters);
// user + sys seconds of this process so far
double process_cpu_seconds();

// Median and 99th percentile (nearest rank) of the iterations, in microseconds.
struct Stats {
  double median_us = 0;
  double p99_us = 0;
};
Stats summarize(std::vector<double> seconds);
// The middle value (the mean of the two middle ones for an even count); 0 for none.
double median(std::vector<double> values);

// One line of results: what every implementation prints on stdout (from rank 0) and what
// `--json FILE` holds.
struct Result {
  std::string impl;  // "dtrain", "gloo", "mpi", "mpi-tcp", "torch"
  std::string coll;
  int np = 0;
  size_t bytes = 0;
  size_t count = 0;
  std::string dtype;
  std::string op;
  double time_us = 0;
  double p99_us = 0;
  double algbw_gbs = 0;
  double busbw_gbs = 0;
  int64_t wrong = -1;  // -1 = not checked
  std::string algo;
  double wait_cpu_us = -1;  // median CPU per op of the ranks waiting on a straggler; -1 = none
  int round = 0;            // which of `dtrain bench --rounds R` (1..R); 0 = a run of one round
  // `dtrain bench --bound`: the time the machine's own limits allow this algorithm
  // (machine_bound.h) over the time measured; -1 = not asked.
  double bound_fraction = -1;
};
Result make_result(std::string impl, Collective c, int nranks, const Layout& layout, ElemType t,
                   Op op, const Measurement& m, std::string algo);
std::string to_json_line(const Result& r);
// Throws std::invalid_argument when the line is not a result.
Result parse_json_line(std::string_view line);

// The arguments the driver passes to every peer, and their parser (shared by the C++ peers).
struct PeerConfig {
  std::vector<Collective> collectives;
  std::vector<size_t> sizes;
  ElemType dtype = ElemType::kF32;
  Op op = Op::kSum;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  double timeout_s = 60;   // limit of each operation, where the implementation has one
  std::string algo;        // peer-specific algorithm filter; "" = all / the default
  double straggle_ms = 0;  // the last rank sleeps this long in every timed op (see Hooks)
};
std::vector<std::string> to_peer_args(const PeerConfig& config);
// Parses to_peer_args' output (argv[0] excluded); throws std::invalid_argument with a usage line.
PeerConfig parse_peer_args(const std::vector<std::string>& args);

}  // namespace dtrain::bench
