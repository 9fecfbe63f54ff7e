// state_handover_bench: handing a state the members hold to a newcomer, as live recovery does:
// a broadcast from one holder against share_tensors (all ranks but the last hold it: pieces from
// every holder across nodes, the state straight from one holder on one node), alternating rounds,
// medians and their ratio, for each size.
//
//   build/bin/dtrain run -n 4 -- build/bin/state_handover_bench --mib 64,256 --rounds 5
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "dtrain/dtrain.h"
#include "dtrain/torch/broadcast.h"
#include "dtrain/torch/runtime.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Broadcast against share_tensors, for a state handed to a newcomer"};
  std::vector<int> mib = {64, 256};
  int rounds = 5;
  app.add_option("--mib", mib, "State sizes in MiB")->delimiter(',');
  app.add_option("--rounds", rounds, "Alternating rounds of each")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  dtrain::configure_runtime(1);
  auto pg = dtrain::init_process_group();
  const int rank = pg->rank(), n = pg->size();
  std::vector<int> holders;
  for (int r = 0; r + 1 < n; ++r) holders.push_back(r);
  if (rank == 0)
    std::printf("%d ranks, holders %s, the newcomer rank %d\n", n,
                fmt::format("{}", fmt::join(holders, ",")).c_str(), n - 1);
  for (int size : mib) {
    // 64 tensors of the size's share, as a model's parameters.
    std::vector<at::Tensor> state;
    for (int i = 0; i < 64; ++i)
      state.push_back(torch::full({int64_t{size} * 1024 * 1024 / 4 / 64}, rank + 1.0f));
    std::vector<double> broadcast, shared;
    for (int round = 0; round < rounds; ++round)
      for (int way = 0; way < 2; ++way) {
        const bool first_shared = round % 2 == 1;  // the order alternates
        const bool use_share = (way == 0) == first_shared;
        pg->barrier()->wait();
        const auto start = std::chrono::steady_clock::now();
        if (use_share)
          dtrain::share_tensors(*pg, state, holders);
        else
          dtrain::broadcast_tensors(*pg, state, 0);
        pg->barrier()->wait();
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        (use_share ? shared : broadcast).push_back(s);
      }
    if (rank == 0)
      std::printf("%4d MiB: broadcast %.3f s, share_tensors %.3f s (medians of %d): %.2fx\n",
                  size, median(broadcast), median(shared), rounds,
                  median(broadcast) / median(shared));
  }
  return 0;
}
