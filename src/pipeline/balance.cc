#include "dtrain/pipeline/balance.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::pipeline {

std::vector<size_t> balance(const std::vector<double>& costs, int parts) {
  const size_t n = costs.size();
  if (parts < 1 || static_cast<size_t>(parts) > n)
    throw InvalidArgumentError(fmt::format(
        "balance: {} modules cannot make {} stages of at least one module each", n, parts));
  // best[k][i]: the least largest part when the first i items make k parts.
  std::vector<double> prefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(parts + 1, std::vector<double>(n + 1, inf));
  best[0][0] = 0;
  for (int k = 1; k <= parts; ++k)
    for (size_t i = k; i <= n; ++i)
      for (size_t j = k - 1; j < i; ++j)
        best[k][i] = std::min(best[k][i], std::max(best[k - 1][j], prefix[i] - prefix[j]));
  // Fill each part from the left up to the bound, leaving an item for each part after it.
  const double bound = best[parts][n] * (1 + 1e-12);
  std::vector<size_t> cuts(parts + 1, 0);
  size_t i = 0;
  for (int k = 0; k < parts; ++k) {
    cuts[k] = i;
    double sum = costs[i++];  // at least one item
    while (i < n && n - i > static_cast<size_t>(parts - k - 1) && sum + costs[i] <= bound)
      sum += costs[i++];
  }
  cuts[parts] = n;
  return cuts;
}

}  // namespace dtrain::pipeline
