// mpi_peer: the MPI side of `dtrain bench` (OpenMPI's own collectives). Started by the driver:
//   mpirun --allow-run-as-root --oversubscribe -np N build/bin/mpi_peer --impl mpi
//       --coll allreduce --sizes 4096,1048576 [--dtype f32] [--op sum] [--iters 20] ...
// and again with `--mca btl tcp,self --mca pml ob1 ... --impl mpi-tcp` (TCP even on one host).
// Rank 0 prints one JSON result line per collective and size on stdout (bench/bench_common.h).
// Timing: MPI_Wtime, MPI_Barrier before each op, MPI_Allreduce(MAX) of the per-rank times.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "bench/bench_common.h"

namespace {

using dtrain::bench::Buffers;
using dtrain::bench::Collective;
using dtrain::bench::ElemType;
using dtrain::bench::Hooks;
using dtrain::bench::Layout;
using dtrain::bench::Op;
using dtrain::bench::PeerConfig;

MPI_Datatype mpi_type(ElemType t) {
  switch (t) {
    case ElemType::kF32: return MPI_FLOAT;
    case ElemType::kF64: return MPI_DOUBLE;
    case ElemType::kI32: return MPI_INT32_T;
    case ElemType::kI64: return MPI_INT64_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(Op op) {
  switch (op) {
    case Op::kSum: return MPI_SUM;
    case Op::kProd: return MPI_PROD;
    case Op::kMin: return MPI_MIN;
    case Op::kMax: return MPI_MAX;
  }
  return MPI_SUM;
}

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw std::runtime_error(std::string(what) + ": " + std::string(text, len));
}

double reduce_scalar(double v, MPI_Op op) {
  double out = 0;
  check_mpi(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, op, MPI_COMM_WORLD), "MPI_Allreduce(stat)");
  return out;
}

void run_size(const std::string& impl, const PeerConfig& config, Collective c, size_t bytes,
              int rank, int n) {
  const Layout layout = dtrain::bench::layout_for(c, bytes, n, config.dtype);
  // In place where dtrain is (allreduce, broadcast, reduce), so that both copy alike.
  const bool in_place =
      c == Collective::kAllreduce || c == Collective::kBroadcast || c == Collective::kReduce;
  Buffers buffers(c, config.dtype, config.op, rank, n, layout, in_place);
  void* in = buffers.input();
  void* out = buffers.output();
  const MPI_Datatype type = mpi_type(config.dtype);
  const MPI_Op op = mpi_op(config.op);
  const int count = static_cast<int>(layout.in_count);
  const int block = static_cast<int>(layout.block);

  Hooks h;
  h.prepare = [&buffers] { buffers.restore(false); };
  h.prepare_check = [&buffers] { buffers.restore(true); };
  h.barrier = [] { check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); };
  h.max_over_ranks = [](double v) { return reduce_scalar(v, MPI_MAX); };
  h.sum_over_ranks = [](double v) { return reduce_scalar(v, MPI_SUM); };
  h.now = [] { return MPI_Wtime(); };
  h.straggle_seconds = config.straggle_ms / 1000.0;
  h.straggler = rank == n - 1;
  if (config.check) {
    h.check = [&, c] {
      return dtrain::bench::count_wrong(c, config.dtype, config.op, rank, n, layout,
                                        buffers.output());
    };
  }
  switch (c) {
    case Collective::kAllreduce:
      h.run = [=] {
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, in, count, type, op, MPI_COMM_WORLD), "MPI_Allreduce");
      };
      break;
    case Collective::kBroadcast:
      h.run = [=] { check_mpi(MPI_Bcast(in, count, type, 0, MPI_COMM_WORLD), "MPI_Bcast"); };
      break;
    case Collective::kReduce:
      h.run = [=] {
        void* send = rank == 0 ? MPI_IN_PLACE : in;
        check_mpi(MPI_Reduce(send, in, count, type, op, 0, MPI_COMM_WORLD), "MPI_Reduce");
      };
      break;
    case Collective::kAllgather:
      h.run = [=] {
        check_mpi(MPI_Allgather(in, block, type, out, block, type, MPI_COMM_WORLD), "MPI_Allgather");
      };
      break;
    case Collective::kGather:
      h.run = [=] {
        check_mpi(MPI_Gather(in, block, type, out, block, type, 0, MPI_COMM_WORLD), "MPI_Gather");
      };
      break;
    case Collective::kScatter:
      h.run = [=] {
        check_mpi(MPI_Scatter(in, block, type, out, block, type, 0, MPI_COMM_WORLD), "MPI_Scatter");
      };
      break;
    case Collective::kReduceScatter:
      h.run = [=] {
        check_mpi(MPI_Reduce_scatter_block(in, out, block, type, op, MPI_COMM_WORLD),
                  "MPI_Reduce_scatter_block");
      };
      break;
    case Collective::kAlltoall:
      h.run = [=] {
        check_mpi(MPI_Alltoall(in, block, type, out, block, type, MPI_COMM_WORLD), "MPI_Alltoall");
      };
      break;
    case Collective::kBarrier:
      h.run = [] { check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); };
      break;
    case Collective::kSendRecv: {
      const int next = (rank + 1) % n;
      const int prev = (rank + n - 1) % n;
      h.run = [=] {
        check_mpi(MPI_Sendrecv(in, count, type, next, 0, out, count, type, prev, 0, MPI_COMM_WORLD,
                               MPI_STATUS_IGNORE),
                  "MPI_Sendrecv");
      };
      break;
    }
  }
  auto m = dtrain::bench::measure(h, config.warmup, config.iters);
  if (rank == 0) {
    auto r = dtrain::bench::make_result(impl, c, n, layout, config.dtype, config.op, m, "default");
    std::printf("%s\n", dtrain::bench::to_json_line(r).c_str());
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  // Errors come back as codes (thrown below) instead of aborting without a word.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0;
  int n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    // --impl names the results ("mpi" or "mpi-tcp"); the rest is the common peer arguments.
    std::string impl = "mpi";
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == "--impl") {
        impl = args[i + 1];
        args.erase(args.begin() + static_cast<std::ptrdiff_t>(i),
                   args.begin() + static_cast<std::ptrdiff_t>(i) + 2);
        break;
      }
    }
    PeerConfig config = dtrain::bench::parse_peer_args(args);
    for (Collective c : config.collectives) {
      if (c == Collective::kBarrier) {
        run_size(impl, config, c, 0, rank, n);
        continue;
      }
      for (size_t bytes : config.sizes) run_size(impl, config, c, bytes, rank, n);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_peer rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  MPI_Finalize();
  return 0;
}
