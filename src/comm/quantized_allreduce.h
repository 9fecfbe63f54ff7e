// The all-reduce behind Wire::kInt8, kInt4, kBf16 and kFp16: f32 values cross the wire as int8 or
// int4 blocks, bf16 or fp16 (common/quantize.h).
#pragma once

#include <cstddef>

#include "comm/collective.h"
#include "dtrain/process_group.h"

namespace dtrain::comm {

// Sums (or, with `average`, averages) data[0, count) over the context's ranks in place, `wire`
// (not kExact) on the wire, every rank ending with the same values. `error` (count floats,
// or null) is the caller's error feedback, carried from call to call.
// The collective kind that names an all-reduce with `wire` in fingerprints and errors.
CollectiveKind collective_of(Wire wire);

void quantized_allreduce(CollectiveContext& ctx, Wire wire, float* data, float* error, size_t count,
                         bool average);

}  // namespace dtrain::comm
