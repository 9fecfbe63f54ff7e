// The all-reduce behind Wire::kInt8: f32 values cross the wire as int8 blocks (common/quantize.h).
#pragma once

#include <cstddef>

#include "comm/collective.h"

namespace dtrain::comm {

// Sums (or, with `average`, averages) data[0, count) over the context's ranks in place, every
// rank ending with the same values. `error` (count floats, or null) is the caller's error
// feedback, carried from call to call.
void quantized_allreduce(CollectiveContext& ctx, float* data, float* error, size_t count,
                         bool average);

}  // namespace dtrain::comm
