// Pipeline: train a model cut into stages on several processes, each batch cut into micro-batches
// that flow through the stages as a schedule says (dtrain/pipeline/schedule.h: gpipe, 1f1b,
// interleaved-1f1b, zb-h1). Optionally replicated: with a data-parallel group, each stage's
// gradients are averaged over its replicas at the end of the step, as DDP would.
//
//   auto world = dtrain::init_process_group();
//   dtrain::ParallelLayout layout(world, {.pipeline_stages = 2});   // 2 stages x N/2 replicas
//   torch::manual_seed(0);
//   torch::nn::Sequential model = make_model();                     // the same on every rank
//   auto cuts = dtrain::balance_by_parameters(model, 2);            // or your own cut points
//   auto stage = dtrain::slice(model, cuts[layout.stage()], cuts[layout.stage() + 1]);
//   dtrain::Pipeline pipe({stage}, layout.pipeline_group(),
//                         {.schedule = "1f1b", .microbatches = 8}, layout.data_group());
//   torch::optim::SGD opt(stage->parameters(), 0.1);
//   for (auto& [x, y] : batches) {                  // x used by the first stage, y by the last
//     opt.zero_grad();
//     at::Tensor loss = pipe.step(x, y, [](const at::Tensor& out, const at::Tensor& y) {
//       return torch::nn::functional::cross_entropy(out, y);
//     });                                           // defined on the last stage only
//     opt.step();                                   // each rank steps its own stage
//   }
//
// The loss function returns the mean over its micro-batch; the runner weighs micro-batch i by
// its share of the batch, so the gradients are those of the mean over the whole batch: the same
// as the unsplit model's (to rounding). Micro-batches are the batch cut along dimension 0 into
// `microbatches` parts whose sizes differ by at most one; shapes may change from step to step.
//
// Stage s of a schedule with v virtual stages per rank lives on rank s % p: give a rank its
// stages in model order (for interleaved-1f1b, v of them: pieces r, r + p, ...).
//
// Errors: a message that does not come within the timeout, a wrong message, an exception in a
// stage's forward or backward, or a dead peer fail the step on this rank with the stage, the
// micro-batch, the action and the peer named; the runner then aborts its group, so every other
// rank of the pipeline fails at once with the same text instead of waiting.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include "dtrain/pipeline/balance.h"
#include "dtrain/pipeline/schedule.h"
#include "dtrain/process_group.h"

namespace dtrain {

struct PipelineOptions {
  std::string schedule = "1f1b";  // a registered schedule (dtrain pipeline-plan --help)
  int microbatches = 4;
  int virtual_stages = 1;                // stages per rank, for interleaved-1f1b
  std::chrono::milliseconds timeout{0};  // of each message; 0 = the group's default
};

// What the last step did on this rank.
struct PipelineStats {
  int64_t step = 0;           // steps run (forward-only calls too)
  double step_ms = 0;         // wall time of the step
  double compute_ms = 0;      // in forward and backward passes
  double wait_ms = 0;         // waiting for messages
  int peak_microbatches = 0;  // most micro-batches whose activations were held at once
  uint64_t bytes_sent = 0;
};

class Pipeline {
 public:
  using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

  // Collective over `group` (the pipeline's ranks, rank i of it runs stages i, i + p, ...).
  // `stages`: this rank's stages in model order. `data_group`: this stage's replicas, or null.
  // Throws InvalidArgumentError when the schedule does not fit (unknown name, a count of stages
  // that is not virtual_stages).
  Pipeline(std::vector<torch::nn::Sequential> stages, std::shared_ptr<ProcessGroup> group,
           PipelineOptions options, std::shared_ptr<ProcessGroup> data_group = nullptr);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // One training step: forward and backward of every micro-batch as the schedule orders them;
  // gradients accumulate into the stages' parameters (call zero_grad before), averaged over the
  // data group when there is one. `input` is read on the rank of stage 0, `target` on the rank
  // of the last stage (others may pass undefined tensors). Returns the batch's loss on the last
  // stage's rank (undefined elsewhere).
  at::Tensor step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss);

  // Forward only, without gradients (evaluation): returns the model's output for `input` on the
  // last stage's rank (undefined elsewhere).
  at::Tensor forward(const at::Tensor& input);

  const pipeline::Schedule& schedule() const;
  // This rank's parameters (every stage it holds), for the optimizer.
  std::vector<at::Tensor> parameters() const;
  bool holds_first_stage() const;
  bool holds_last_stage() const;
  PipelineStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Cutting a torch::nn::Sequential into stages. Cut points are module indices: stage k holds
// modules cuts[k] .. cuts[k+1]-1 (cuts[0] = 0, cuts.back() = the module count).

// The stage of modules [begin, end) of `model`: the same module objects (not copies), under
// their names in `model` ("3.weight" stays "3.weight"), so checkpoints and comparisons line up.
torch::nn::Sequential slice(const torch::nn::Sequential& model, size_t begin, size_t end);
// Contiguous parts whose largest cost is the least possible (each part at least one module).
using pipeline::balance;
// By parameter count (modules without parameters cost nothing).
std::vector<size_t> balance_by_parameters(const torch::nn::Sequential& model, int parts);
// By measured time: each module's forward and backward on `sample` (the model's input), the
// median of `repeats` runs. Timings differ from rank to rank, and so would the cuts: with a
// group (collective over it) the times are averaged over its ranks, so every rank cuts alike.
std::vector<size_t> balance_by_time(const torch::nn::Sequential& model, int parts,
                                    const at::Tensor& sample, int repeats = 5,
                                    ProcessGroup* group = nullptr);

}  // namespace dtrain
