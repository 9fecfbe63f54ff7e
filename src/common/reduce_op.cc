#include "dtrain/reduce_op.h"

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain {
namespace {

struct OpName {
  std::string_view name;
  ReduceOp op;
};
constexpr OpName kOpNames[] = {
    {"sum", ReduceOp::kSum}, {"prod", ReduceOp::kProd}, {"min", ReduceOp::kMin},
    {"max", ReduceOp::kMax}, {"avg", ReduceOp::kAvg},   {"band", ReduceOp::kBand},
    {"bor", ReduceOp::kBor}, {"bxor", ReduceOp::kBxor},
};

}  // namespace

std::string_view to_string(ReduceOp op) {
  for (const auto& entry : kOpNames)
    if (entry.op == op) return entry.name;
  return "unknown";
}

ReduceOp parse_reduce_op(std::string_view name) {
  for (const auto& entry : kOpNames)
    if (entry.name == name) return entry.op;
  throw InvalidArgumentError(fmt::format(
      "unknown reduce op '{}': use one of sum, prod, min, max, avg, band, bor, bxor", name));
}

}  // namespace dtrain
