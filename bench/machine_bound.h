// What this machine allows, measured with no dtrain code in the way: the floor under every
// collective. `dtrain bench --bound` measures it in the same run as the collectives and prices
// each collective's algorithm with it (the cost model's formulas, comm/cost_model.h, with these
// constants), so that each row says how far it is from the machine's own limit; core_pingpong
// prints the cache line's round trip over time.
#pragma once

#include <string>

namespace dtrain::bench {

struct MachineBound {
  double memcpy_gbs = 0;                // one thread copying a buffer beyond the caches
  double memcpy_all_gbs = 0;            // every CPU copying at once, all of them together
  int copiers = 0;                      // ... how many
  double memcpy_cached_gbs = 0;         // one thread copying a buffer that stays in its own cache
  double tcp_stream_gbs = 0;            // one loopback TCP stream, one thread each end
  double tcp_all_gbs = 0;               // a stream per CPU at once, all of them together
  double socket_round_trip_us = 0;      // one byte over loopback TCP and back
  double cache_line_round_trip_ns = 0;  // a cache line from one CPU to another and back
};

// Measures each rate as the best of three samples of `seconds` / 2, the round trips for `seconds`.
MachineBound measure_machine_bound(double seconds = 0.25);

// The median round trip of a cache line between CPUs `cpu_a` and `cpu_b` over `trips` trips;
// 0 when the threads cannot be pinned to them.
double cache_line_round_trip_ns(int cpu_a, int cpu_b, int trips);

std::string to_json(const MachineBound& b);
// Throws std::invalid_argument naming what is wrong.
MachineBound parse_machine_bound(const std::string& json);

}  // namespace dtrain::bench
