// Reduction operators of reduce, all-reduce and reduce-scatter.
#pragma once

#include <cstdint>
#include <string_view>

namespace dtrain {

enum class ReduceOp : uint8_t {
  kSum,
  kProd,
  kMin,
  kMax,
  kAvg,   // the sum divided by the number of ranks (integers: truncated toward zero)
  kBand,  // bitwise and, integer dtypes only
  kBor,   // bitwise or, integer dtypes only
  kBxor,  // bitwise xor, integer dtypes only
};

std::string_view to_string(ReduceOp op);
// Parses "sum", "prod", "min", "max", "avg", "band", "bor", "bxor"; InvalidArgumentError else.
ReduceOp parse_reduce_op(std::string_view name);

}  // namespace dtrain
