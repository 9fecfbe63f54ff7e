// The all-reduce behind Wire::kInt8 and Wire::kBf16: f32 values cross the wire as int8 blocks or
// bf16 (common/quantize.h).
#pragma once

#include <cstddef>

#include "comm/collective.h"
#include "dtrain/process_group.h"

namespace dtrain::comm {

// Sums (or, with `average`, averages) data[0, count) over the context's ranks in place, `wire`
// (kInt8 or kBf16) on the wire, every rank ending with the same values. `error` (count floats,
// or null) is the caller's error feedback, carried from call to call.
void quantized_allreduce(CollectiveContext& ctx, Wire wire, float* data, float* error, size_t count,
                         bool average);

}  // namespace dtrain::comm
