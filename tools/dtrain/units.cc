#include "tools/dtrain/units.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace dtrain::tools {
namespace {

double scale_of(const std::string& unit) {
  if (unit.empty()) return 1;
  if (unit == "K" || unit == "k") return 1e3;
  if (unit == "M" || unit == "m") return 1e6;
  if (unit == "B" || unit == "b" || unit == "G" || unit == "g") return 1e9;
  if (unit == "T" || unit == "t") return 1e12;
  return 0;
}

}  // namespace

double parse_count(const std::string& text, const std::string& what) {
  auto refuse = [&] {
    return std::invalid_argument(fmt::format(
        "{}: '{}' is not a count: give a positive number, optionally with K, M, B (or G) or T "
        "(powers of 1000), e.g. 110000000, 1.1e8, 110M or 7B",
        what, text));
  };
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw refuse();
  }
  const double scale = scale_of(text.substr(used));
  if (scale == 0 || !std::isfinite(v) || v <= 0) throw refuse();
  return v * scale;
}

int64_t parse_whole_count(const std::string& text, const std::string& what) {
  const double v = parse_count(text, what);
  if (v > std::ldexp(1.0, 50))
    throw std::invalid_argument(fmt::format("{}: {} is more than 2^50", what, text));
  return std::llround(v);
}

}  // namespace dtrain::tools
