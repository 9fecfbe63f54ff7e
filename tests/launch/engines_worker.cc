// engines_worker: one rank of a job started by mpirun, srun or sbatch (tests/launch/engines_test).
// It forms the world group from whatever launcher started it, all-reduces, and prints one line:
//
//   mpirun -np 3 build/bin/engines_worker_mpi
//   srun -n 3 build/bin/engines_worker
//   RESULT {"source":"slurm","rank":1,"world_size":3,"local_rank":1,"local_world_size":3,
//           "node_rank":0,"master_addr":"node1","master_port":29500,"sum":6,"max":2,"ok":true}
//
// sum is the all-reduced sum of rank + 1 over every element of a 4096-float buffer (world *
// (world + 1) / 2 when right), max the all-reduced maximum rank; ok says every element agreed.
// engines_worker links dtrain_core only; engines_worker_mpi also the backends, so that under
// mpirun the store's address can travel through MPI (src/comm/store_discovery.h).
// `--late-rank0 S` makes rank 0 start S seconds late, for the tests of the timeouts.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dtrain/dtrain.h"

int main(int argc, char** argv) {
  try {
    const dtrain::Identity id = dtrain::resolve_identity();
    if (argc == 3 && std::string_view(argv[1]) == "--late-rank0" && id.rank == 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(std::stod(argv[2])));
    auto pg = dtrain::init_process_group();

    std::vector<float> values(4096, static_cast<float>(pg->rank() + 1));
    pg->allreduce(dtrain::TensorView::of(values))->wait();
    const float expected = pg->size() * (pg->size() + 1) / 2.0f;
    bool ok = true;
    for (float v : values) ok = ok && v == expected;

    std::vector<int32_t> top = {pg->rank()};
    pg->allreduce(dtrain::TensorView::of(top), {.op = dtrain::ReduceOp::kMax})->wait();
    pg->barrier()->wait();

    nlohmann::ordered_json line = {
        {"source", id.source},
        {"rank", pg->rank()},
        {"world_size", pg->size()},
        {"local_rank", id.local_rank},
        {"local_world_size", id.local_world_size},
        {"node_rank", id.node_rank},
        {"master_addr", id.master_addr},
        {"master_port", id.master_port},
        {"sum", values[0]},
        {"max", top[0]},
        {"ok", ok},
    };
    // One write per line: the ranks share the launcher's stdout.
    std::string text = "RESULT " + line.dump() + "\n";
    if (::write(1, text.data(), text.size()) != static_cast<ssize_t>(text.size())) return 2;
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engines_worker: %s\n", e.what());
    return 1;
  }
}
