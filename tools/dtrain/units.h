// Counts as people write them on the command line, for every `dtrain` command that takes one
// (estimate, predict): 100000000, 1e8, 25.6M, 7B. K, M, B (or G) and T are powers of 1000.
#pragma once

#include <cstdint>
#include <string>

namespace dtrain::tools {

// The count `text` says; `what` names the flag in the error ("--params: '7X' is not a count:
// ..."). Throws std::invalid_argument on anything but a positive finite number with an optional
// suffix.
double parse_count(const std::string& text, const std::string& what);
// The same, as a whole number of at most 2^50.
int64_t parse_whole_count(const std::string& text, const std::string& what);

}  // namespace dtrain::tools
