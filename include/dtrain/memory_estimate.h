// What a training job holds per rank, before running it: the bytes of parameters, gradients,
// optimizer state and activations for data parallelism (DDP), sharded data parallelism (ZeRO
// stages 1-3), tensor and pipeline parallelism, at a world size, precision and batch. What a
// job's memory request should come from (`dtrain estimate`).
//
//   auto e = dtrain::estimate_memory({.parameters = 100'000'000, .optimizer = "adam",
//                                     .world_size = 4, .layout = "zero3"});
//   e.model_states();   // parameters + gradients + optimizer state, bytes per rank
//
// The formulas (Rajbhandari et al., 2020, "ZeRO"), with P parameters over N ranks and b bytes
// per parameter and per gradient (4 in fp32; 2 in bf16/fp16, which also keep a 4-byte master
// copy in the optimizer state), k bytes of optimizer state per parameter (SGD 0, momentum 4,
// Adam/AdamW 8, + 4 for the master copy in 16-bit precision), U the largest unit's parameters:
//   ddp     P*b + P*b + P*k              (+ P*b for dtrain's gradient buckets)
//   zero1   P*b + P*b + P*k/N            (fp32: + 4P/N master shard + 4P/N its gradient, as
//   zero2   P*b + (P*b + P*k)/N           dtrain's ShardedDataParallel keeps them; + U*b
//                                         gradients in backward, x3 at stage 2)
//   zero3   (P*b + P*b + P*k)/N + U*b x 5 (4 without prefetch) + 4U/N: the units held in
//           backward (two gathered, a whole gradient, autograd's new one, one in flight)
//   tp      the model states / N (every layer cut N ways)
//   pp      the model states / N (stages of equal parameter counts), activations of the
//           micro-batches the schedule holds
// Activations: `activation_bytes_per_sample` x the samples a rank holds at once (its batch; in a
// pipeline, its micro-batches in flight), when given.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain {

struct MemoryEstimateOptions {
  int64_t parameters = 0;
  std::string optimizer = "adam";  // sgd, momentum, adam, adamw
  std::string precision = "fp32";  // fp32, bf16, fp16 (16-bit parameters and gradients)
  int world_size = 1;
  std::string layout = "ddp";  // ddp, zero1, zero2, zero3, tp, pp
  int64_t largest_unit = 0;    // zero: parameters of the largest unit (gathered at stage 3)
  bool prefetch = true;        // zero3: the next unit is gathered while one computes
  int64_t batch = 0;           // samples per rank per step (0: no activations counted)
  int64_t activation_bytes_per_sample = 0;
  int microbatches = 1;  // pp: the batch is cut into this many
};

struct MemoryEstimate {
  int64_t parameters = 0;  // bytes per rank
  int64_t gradients = 0;
  int64_t optimizer = 0;
  int64_t gathered = 0;  // zero3: parameters gathered for compute; ddp: gradient buckets
  int64_t activations = 0;
  int64_t model_states() const { return parameters + gradients + optimizer + gathered; }
  int64_t total() const { return model_states() + activations; }
  std::vector<std::string> notes;  // the formula of each line, for printing
};

// Throws InvalidArgumentError naming the option that does not fit.
MemoryEstimate estimate_memory(const MemoryEstimateOptions& options);

// The layouts estimate_memory knows, in the order `dtrain estimate --layout all` prints them.
const std::vector<std::string>& memory_layouts();

}  // namespace dtrain
