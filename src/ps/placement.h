// Where a table's data lives among the servers.
//
// Dense: a tensor of at least kCutBytes is cut into one slice per server (equal sizes, so a large
// tensor loads every server alike); a smaller one goes whole to the server holding the fewest
// bytes so far. Placing the tables of a model in order thus balances bytes, unlike ps-lite's key
// ranges, which send every small key to server 0. The plan depends only on the tables placed
// before, so workers that create tables in the same order agree on it (servers check that they do).
//
// Sparse: row `id` lives on server mix(id) % S, where mix is the SplitMix64 finaliser: ids that
// are dense ranges, or all multiples of S, still spread evenly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dtrain::ps {

inline constexpr size_t kCutBytes = size_t{512} << 10;
// Slices travel and are updated in chunks of this many elements, so that a large push is
// received, applied and answered piece by piece, overlapping transfer and update.
inline constexpr size_t kChunkElems = size_t{256} << 10;  // 1 MiB of f32

struct Slice {
  int server = 0;
  uint64_t offset = 0;  // first element in the whole tensor
  uint64_t length = 0;
};

// Places a dense table of `numel` f32 elements; `load` (bytes per server) is updated.
std::vector<Slice> place_dense(uint64_t numel, std::vector<uint64_t>& load);

uint64_t mix64(uint64_t x);
inline int server_of_row(uint64_t id, int num_servers) {
  return static_cast<int>(mix64(id) % static_cast<uint64_t>(num_servers));
}

}  // namespace dtrain::ps
