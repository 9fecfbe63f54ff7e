#include "dtrain/step_shape.h"

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain {

OnResize parse_on_resize(std::string_view name) {
  if (name == "keep-rank-batch") return OnResize::kKeepRankBatch;
  if (name == "scale-lr") return OnResize::kScaleLr;
  if (name == "keep-global-batch") return OnResize::kKeepGlobalBatch;
  throw InvalidArgumentError(fmt::format(
      "'{}' is no way to resize a step: keep-rank-batch, scale-lr or keep-global-batch", name));
}

StepShape step_shape(OnResize on_resize, StepShape at_start, int size_at_start, int size) {
  if (size < 1 || size_at_start < 1 || at_start.batch_per_rank < 1)
    throw InvalidArgumentError(fmt::format(
        "step_shape: {} rank(s) now and {} at start, a batch of {} per rank: each must be at "
        "least 1",
        size, size_at_start, at_start.batch_per_rank));
  StepShape now = at_start;
  switch (on_resize) {
    case OnResize::kKeepRankBatch:
      break;
    case OnResize::kScaleLr:
      now.learning_rate = at_start.learning_rate * size / size_at_start;
      break;
    case OnResize::kKeepGlobalBatch:
      now.batch_per_rank = (at_start.batch_per_rank * size_at_start + size - 1) / size;
      break;
  }
  return now;
}

}  // namespace dtrain
