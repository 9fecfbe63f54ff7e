// What a change of a live world's size does to each step: the batch per rank and the learning
// rate, the program's choice among the conventions of the elastic trainers it comes from.
//
//   keep-rank-batch    each rank keeps its batch and the rate: the global batch follows the world
//                      (torchft's way, and Horovod's when the program does nothing)
//   scale-lr           each rank keeps its batch; the rate follows the world, as the global
//                      batch does (Horovod's elastic examples, in a reset callback: the linear
//                      scaling rule)
//   keep-global-batch  each rank's batch grows as the world shrinks (rounded up), so that a step
//                      trains as many samples as at start, at the rate of the start
//
// train_fashion_mnist takes it as --on-resize; Python scripts call
// dtrain.torch.live.step_shape() after a re-forming (hvd.elastic: in a reset callback).
#pragma once

#include <cstdint>
#include <string_view>

namespace dtrain {

enum class OnResize { kKeepRankBatch, kScaleLr, kKeepGlobalBatch };

// "keep-rank-batch", "scale-lr" or "keep-global-batch"; InvalidArgumentError naming them else.
OnResize parse_on_resize(std::string_view name);

struct StepShape {
  int64_t batch_per_rank = 0;
  double learning_rate = 0;
};

// The step's shape at `size` ranks, for a job that started with `at_start` at `size_at_start`.
// InvalidArgumentError on a size or batch below 1.
StepShape step_shape(OnResize on_resize, StepShape at_start, int size_at_start, int size);

}  // namespace dtrain
