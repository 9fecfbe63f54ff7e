// ShardedDataParallel: data parallelism that does not keep a whole copy of the model states on
// every rank (ZeRO, Rajbhandari et al. 2020; PyTorch's FSDP). Each rank owns 1/N of every
// parameter's optimizer state (stage 1), of its gradient (stage 2) and of the parameter itself
// (stage 3). With Adam in fp32 that is 16 bytes per parameter on every rank under DDP, and
// 16/N at stage 3 plus the one or two units gathered for compute.
//
//   auto pg = dtrain::init_process_group();
//   torch::nn::Sequential model = make_model();                 // the same on every rank
//   dtrain::ShardedDataParallel sdp(model, pg, {.stage = 3});   // rank 0's weights, sharded
//   torch::optim::Adam opt(sdp.parameters(), 1e-3);             // this rank's shards only
//   for (auto& [x, y] : batches) {
//     opt.zero_grad();
//     auto loss = torch::nn::functional::cross_entropy(sdp.forward(x), y);
//     loss.backward();            // gradients reduce-scattered into the shards during backward
//     sdp.clip_grad_norm(1.0);    // optional: the norm over every rank's shards
//     opt.step();                 // each rank updates its shard
//   }                             // the next forward all-gathers the updated parameters
//
// Units. The model is cut into units, each gathered and released as one flat buffer: for a
// torch::nn::Sequential, each child with parameters starts a unit (children without parameters
// join the unit before them; min_unit_parameters groups small children); any other module is
// one unit, run through forward(fn). A unit's flat buffer holds its parameters in registration
// order, padded to a multiple of N; rank r owns elements [r*S, (r+1)*S), S = padded/N.
//
// Stage 3: before a unit's forward its parameters are all-gathered (the next unit's gather is
// started first, so it overlaps this unit's compute), and released after it; backward gathers
// each unit again, before its gradients are computed, and releases it when they are. Released
// parameters are empty tensors: read the model through full_parameters() or after
// gather_parameters(). Stages 1 and 2 keep the parameters whole and all-gather them at the start
// of the next forward after a step.
//
// Gradients: when every parameter of a unit has its gradient, the unit's flat gradient is
// reduce-scattered (averaged) into this rank's shard, in reverse unit order on every rank, while
// backward goes on with the units before it. The shards' .grad accumulate like any parameter's
// until the optimizer's zero_grad(). Stage 1 keeps the whole flat gradient between steps;
// stages 2 and 3 free it once it is reduced. In no_sync(), gradients accumulate whole and
// locally; the next backward outside it reduces the sum.
//
// Mixed precision: communication_dtype = at::kBFloat16 or at::kHalf sends gradients and
// parameters in 16 bits (half the bytes) while the shards and the optimizer stay in fp32, the
// master weights; the parameters computed with are then the 16-bit rounding of the masters.
//
// Every parameter must be a float32 tensor that requires grad and belongs to one unit, all on
// one device (the CPU or a GPU: the flat buffers live there); anything else is refused at
// construction, on every rank, naming the parameter.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include "dtrain/process_group.h"

namespace dtrain {

struct ShardingOptions {
  int stage = 3;  // 1: optimizer state, 2: + gradients, 3: + parameters
  at::ScalarType communication_dtype = at::kFloat;  // kBFloat16 or kHalf: 16-bit on the wire
  bool prefetch = true;                  // gather the next unit while this one computes (stage 3)
  bool broadcast_buffers = true;         // rank 0's buffers before each forward that records grads
  int64_t min_unit_parameters = 0;       // Sequential: children grouped until a unit has this many
  std::chrono::milliseconds timeout{0};  // of each collective; 0 = the group's default
};

// One unit as the sharding sees it, for planning and tests.
struct ShardedUnit {
  std::vector<std::string> parameter_names;  // qualified names in the model
  std::vector<std::vector<int64_t>> shapes;  // of each parameter
  std::vector<int64_t> offsets;              // of each parameter in the unit's flat buffer
  int64_t numel = 0;                         // parameters in the unit
  int64_t shard_numel = 0;                   // elements each rank owns (padded / N)
};

class ShardedDataParallel {
 public:
  // Collective: every rank constructs it with the same model. Checks that every rank has the
  // same parameters, copies rank 0's parameters and buffers, and keeps this rank's shards.
  ShardedDataParallel(torch::nn::Sequential model, std::shared_ptr<ProcessGroup> group,
                      ShardingOptions options = {});
  // Any module, as one unit; run it through forward(fn).
  ShardedDataParallel(std::shared_ptr<torch::nn::Module> module,
                      std::shared_ptr<ProcessGroup> group, ShardingOptions options = {});
  // A TORCH_MODULE holder (your own Net) is taken as it is: one unit.
  template <typename Impl>
  ShardedDataParallel(const torch::nn::ModuleHolder<Impl>& module,
                      std::shared_ptr<ProcessGroup> group, ShardingOptions options = {})
      : ShardedDataParallel(std::static_pointer_cast<torch::nn::Module>(module.ptr()),
                            std::move(group), std::move(options)) {}
  ~ShardedDataParallel();
  ShardedDataParallel(const ShardedDataParallel&) = delete;
  ShardedDataParallel& operator=(const ShardedDataParallel&) = delete;

  // The Sequential's forward, unit by unit.
  at::Tensor forward(const at::Tensor& input);
  // A module of one unit: its forward inside `fn`, which returns the output (or outputs).
  template <typename Forward>
  requires std::invocable<Forward&>
  auto forward(Forward&& fn) {
    begin_module_forward();
    auto out = fn();
    end_forward(out);
    return out;
  }

  // This rank's shards, one flat fp32 tensor per unit: what the optimizer steps.
  std::vector<at::Tensor> parameters() const;
  // Collective: scales the shards' gradients so that their norm over every rank is at most
  // max_norm (as torch::nn::utils::clip_grad_norm_ would on the whole model); returns the norm
  // before scaling.
  double clip_grad_norm(double max_norm);

  // Collective: makes the module's parameters whole and current (after opt.step(), for
  // evaluation or export outside forward). At stage 3 they stay whole until the next forward;
  // call it before destroying a stage-3 ShardedDataParallel whose module is still wanted (its
  // parameters are otherwise left empty).
  void gather_parameters();
  // Collective: every parameter's full value by qualified name (copies), on every rank.
  std::map<std::string, at::Tensor> full_parameters();
  // With a runner that calls the module itself rather than through forward() (the pipeline
  // runner, dtrain/torch/pipeline.h), at stage 1 or 2: collective, reduce-scatters the gradients
  // its backward passes accumulated in the parameters into the shards (call it after the
  // runner's step, then opt.step(), then gather_parameters() before the next step).
  //   dtrain::Pipeline pipe({stage}, layout.pipeline_group(), {...});        // no data group
  //   dtrain::ShardedDataParallel zero(stage, layout.data_group(), {.stage = 1});
  //   torch::optim::Adam opt(zero.parameters(), 1e-3);
  //   opt.zero_grad(); pipe.step(x, y, loss_fn); zero.reduce_gradients(); opt.step();
  //   zero.gather_parameters();
  void reduce_gradients();
  // After the shards were changed other than by a step (a checkpoint loaded into them): the
  // module's parameters are gathered again before the next use. Not collective.
  void shards_changed();

  // While a NoSync is alive, backward accumulates gradients whole on each rank without
  // communicating; the first backward after it reduces the accumulated sum.
  class NoSync {
   public:
    explicit NoSync(ShardedDataParallel& sdp) : sdp_(&sdp), previous_(sdp.sync_) {
      sdp.sync_ = false;
    }
    ~NoSync() {
      if (sdp_ != nullptr) sdp_->sync_ = previous_;
    }
    NoSync(NoSync&& other) noexcept : sdp_(other.sdp_), previous_(other.previous_) {
      other.sdp_ = nullptr;
    }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;

   private:
    ShardedDataParallel* sdp_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  std::vector<ShardedUnit> units() const;
  const ShardingOptions& options() const { return options_; }
  torch::nn::Module& module() { return *module_; }
  const std::shared_ptr<ProcessGroup>& group() const { return group_; }

 private:
  struct Unit;
  struct UnitModules;
  ShardedDataParallel(std::shared_ptr<torch::nn::Module> module,
                      std::vector<std::vector<std::shared_ptr<torch::nn::Module>>> units,
                      std::shared_ptr<ProcessGroup> group, ShardingOptions options);
  // The constructor's steps, in the order it takes them.
  std::vector<UnitModules> find_units(
      std::vector<std::vector<std::shared_ptr<torch::nn::Module>>> given_units);
  std::string lay_out_units(const std::vector<UnitModules>& unit_modules, std::string& refusal);
  void agree_on_model(const std::string& description, const std::string& refusal) const;
  void shard_unit(size_t unit);
  void flatten_parameters(size_t unit);
  void take_shard(size_t unit);
  void register_gradient_hooks(size_t unit);
  void begin_forward();
  void begin_module_forward();
  void gather_for_forward(size_t unit);
  void after_unit_forward(size_t unit, const at::Tensor& output, bool last);
  void end_forward(const at::Tensor& output);
  void end_forward(const std::vector<at::Tensor>& outputs);
  void start_gather(size_t unit);
  void finish_gather(size_t unit);
  void release(size_t unit);
  void ensure_gradients(size_t unit);
  void before_unit_backward(size_t unit);
  void on_gradient(size_t unit, size_t param);
  void launch_ready_reductions();
  void launch_reduction(size_t unit);
  void complete_reduction(size_t unit);
  void finish_backward();
  void queue_finish();
  std::string where(size_t unit) const;

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  ShardingOptions options_;
  std::vector<std::unique_ptr<Unit>> units_;
  bool sequential_ = false;
  bool sync_ = true;            // false inside no_sync()
  bool armed_ = false;          // a forward recorded gradients that backward must reduce
  bool finish_queued_ = false;  // finish_backward queued on the autograd engine
  bool backward_started_ = false;
  int64_t next_to_reduce_ = -1;  // units reduce strictly from the last to the first
};

}  // namespace dtrain
