#include "ps/placement.h"

#include <algorithm>

namespace dtrain::ps {

std::vector<Slice> place_dense(uint64_t numel, std::vector<uint64_t>& load) {
  const int servers = static_cast<int>(load.size());
  const uint64_t bytes = numel * sizeof(float);
  std::vector<Slice> slices;
  if (servers > 1 && bytes >= kCutBytes) {
    // Equal parts, the remainder spread one element each over the first servers.
    uint64_t base = numel / servers, extra = numel % servers, offset = 0;
    for (int s = 0; s < servers; ++s) {
      uint64_t length = base + (static_cast<uint64_t>(s) < extra ? 1 : 0);
      slices.push_back({s, offset, length});
      load[s] += length * sizeof(float);
      offset += length;
    }
    return slices;
  }
  int least = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
  load[least] += bytes;
  slices.push_back({least, 0, numel});
  return slices;
}

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace dtrain::ps
