// The formulas are in include/dtrain/memory_estimate.h; docs/memory.md says how to use them.
#include "dtrain/memory_estimate.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain {
namespace {

int64_t ceil_div(int64_t a, int64_t n) { return (a + n - 1) / n; }

// a * b, refused when it would not fit in 63 bits (a model of 10^18 bytes is a typo).
int64_t times(int64_t a, int64_t b, const char* what) {
  if (a != 0 && b > std::numeric_limits<int64_t>::max() / a)
    throw InvalidArgumentError(fmt::format("estimate: {} overflows ({} x {})", what, a, b));
  return a * b;
}

}  // namespace

const std::vector<std::string>& memory_layouts() {
  static const std::vector<std::string> layouts = {"ddp", "zero1", "zero2", "zero3", "tp", "pp"};
  return layouts;
}

MemoryEstimate estimate_memory(const MemoryEstimateOptions& o) {
  if (o.parameters < 0)
    throw InvalidArgumentError(fmt::format("estimate: {} parameters", o.parameters));
  if (o.world_size < 1)
    throw InvalidArgumentError(
        fmt::format("estimate: world size {}; give 1 or more", o.world_size));
  if (o.batch < 0 || o.activation_bytes_per_sample < 0 || o.largest_unit < 0 || o.microbatches < 1)
    throw InvalidArgumentError(
        "estimate: batch, activation bytes, the largest unit and micro-batches cannot be negative "
        "(micro-batches at least 1)");
  const auto& layouts = memory_layouts();
  if (std::find(layouts.begin(), layouts.end(), o.layout) == layouts.end())
    throw InvalidArgumentError(fmt::format("estimate: layout '{}' is unknown; the layouts are {}",
                                           o.layout, fmt::join(layouts, ", ")));
  int64_t b = 0;  // bytes of a parameter and of a gradient
  bool mixed = false;
  if (o.precision == "fp32") {
    b = 4;
  } else if (o.precision == "bf16" || o.precision == "fp16") {
    b = 2;
    mixed = true;
  } else {
    throw InvalidArgumentError(
        fmt::format("estimate: precision '{}' is unknown; give fp32, bf16 or fp16", o.precision));
  }
  int64_t k = 0;  // optimizer state per parameter
  if (o.optimizer == "sgd")
    k = 0;
  else if (o.optimizer == "momentum")
    k = 4;
  else if (o.optimizer == "adam" || o.optimizer == "adamw")
    k = 8;
  else
    throw InvalidArgumentError(fmt::format(
        "estimate: optimizer '{}' is unknown; give sgd, momentum, adam or adamw", o.optimizer));
  if (mixed) k += 4;  // the fp32 master copy of the parameters

  const int64_t P = o.parameters, N = o.world_size;
  const int64_t pb = times(P, b, "the parameters' bytes"),
                pk = times(P, k, "the optimizer's bytes");
  MemoryEstimate e;
  const std::string per = fmt::format("{} B", b);
  if (o.layout == "ddp") {
    e.parameters = pb;
    e.gradients = pb;
    e.optimizer = pk;
    e.gathered = pb;
    e.notes = {fmt::format("P x {}", per), fmt::format("P x {}", per), fmt::format("P x {} B", k),
               fmt::format("gradient buckets: P x {}", per)};
  } else if (o.layout == "zero1" || o.layout == "zero2") {
    // The paper's figures; in fp32 dtrain's ShardedDataParallel also keeps each rank's shard as
    // an fp32 master beside the whole parameters, and the shard's reduced gradient beside the
    // whole gradients (stage 1) or instead of them (stage 2).
    const bool two = o.layout == "zero2";
    const int64_t shard = mixed ? 0 : ceil_div(times(P, 4, "the shards' bytes"), N);
    e.parameters = pb + shard;
    e.gradients = (two ? ceil_div(pb, N) : pb) + (mixed || two ? 0 : shard);
    e.optimizer = ceil_div(pk, N);
    // Held during backward, per unit of the largest size: autograd's new gradient before it is
    // added in (stage 1); at stage 2 also the unit's whole gradient and the one in flight.
    const int64_t unit = o.largest_unit > 0 ? o.largest_unit : 0;
    e.gathered = times(unit, b * (two ? 3 : 1), "the unit's gradient bytes");
    const std::string plus = shard > 0 ? fmt::format(" + P x 4 B / {}", N) : "";
    e.notes = {fmt::format("P x {}{}", per, plus),
               two ? fmt::format("P x {} / {}", per, N) : fmt::format("P x {}{}", per, plus),
               fmt::format("P x {} B / {}", k, N),
               unit > 0 ? fmt::format("gradients of the largest unit ({} parameters) x {}{}", unit,
                                      per, two ? " x 3 (whole, new, in flight)" : "")
                        : "a unit's gradients in backward (unknown: give --largest-unit)"};
  } else if (o.layout == "zero3") {
    e.parameters = ceil_div(pb, N);
    e.gradients = ceil_div(pb, N);
    e.optimizer = ceil_div(pk, N);
    // Held during backward (measured in tests/torch/sharded_data_parallel_test.cc): the unit
    // computing and the next one prefetched, its whole gradient and autograd's new one, and one
    // reduction in flight with its output (1/N of a unit).
    const int64_t unit = o.largest_unit > 0 ? o.largest_unit : 0;
    const int64_t held = (o.prefetch ? 2 : 1) + 2 + 1;
    e.gathered = times(unit, b * held, "the gathered units' bytes") + ceil_div(unit * 4, N);
    e.notes = {fmt::format("P x {} / {}", per, N), fmt::format("P x {} / {}", per, N),
               fmt::format("P x {} B / {}", k, N),
               unit > 0 ? fmt::format("the largest unit ({} parameters) x {} x {} (gathered{}, "
                                      "gradient, new gradient, in flight) + its shard",
                                      unit, per, held, o.prefetch ? " x 2 with prefetch" : "")
                        : "the units gathered in backward (unknown: give --largest-unit)"};
  } else {  // tp, pp: the model's states cut N ways
    e.parameters = ceil_div(pb, N);
    e.gradients = ceil_div(pb, N);
    e.optimizer = ceil_div(pk, N);
    e.notes = {fmt::format("P x {} / {}", per, N), fmt::format("P x {} / {}", per, N),
               fmt::format("P x {} B / {}", k, N), ""};
  }
  // Activations: the samples a rank holds at once. A pipeline stage holds about 1/N of a
  // sample's activations for each micro-batch in flight: N of them on the first stage (1F1B),
  // so about one micro-batch of the whole model's.
  int64_t samples = o.batch;
  int64_t per_sample = o.activation_bytes_per_sample;
  std::string how = fmt::format("{} samples x {} B", o.batch, per_sample);
  if (o.layout == "pp") {
    samples = ceil_div(o.batch, o.microbatches) * std::min<int64_t>(N, o.microbatches);
    per_sample = ceil_div(per_sample, N);
    how = fmt::format("{} micro-batches in flight of {} samples x {} B / {} stages",
                      std::min<int64_t>(N, o.microbatches), ceil_div(o.batch, o.microbatches),
                      o.activation_bytes_per_sample, N);
  }
  e.activations = times(samples, per_sample, "the activations' bytes");
  e.notes.push_back(o.activation_bytes_per_sample > 0 && o.batch > 0
                        ? how
                        : "not counted (give --batch and --activation-bytes)");
  return e;
}

}  // namespace dtrain
