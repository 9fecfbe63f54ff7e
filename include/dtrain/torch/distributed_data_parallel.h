// DistributedDataParallel: train one LibTorch module on many processes, each on its own share of
// every batch, with gradients averaged during backward.
//
//   auto pg = dtrain::init_process_group();
//   auto model = std::make_shared<Net>();
//   dtrain::DistributedDataParallel ddp(model, pg);          // rank 0's weights everywhere
//   torch::optim::SGD opt(model->parameters(), 0.01);
//   for (auto& [x, y] : batches) {
//     opt.zero_grad();
//     auto out = ddp.forward([&] { return model->forward(x); });
//     torch::nn::functional::cross_entropy(out, y).backward();   // buckets all-reduce here
//     opt.step();                                                // averaged gradients
//   }
//
// How: parameters are grouped into buckets in reverse registration order (the order backward
// produces their gradients; the first bucket is small so communication starts early). A hook on
// each parameter's gradient accumulator copies the gradient into its bucket; a full bucket is
// all-reduced asynchronously at once, in bucket order on every rank, so communication overlaps
// the rest of backward. When backward ends, DDP waits for the buckets and writes the averages
// back into .grad (or makes .grad a view of the bucket: DdpOptions::gradient_as_bucket_view).
// After the first iteration the buckets are rebuilt in the order gradients actually arrived on
// rank 0. Buffers (batch-norm statistics) are broadcast from rank 0 before each forward that
// records gradients.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dtrain/process_group.h"
#include "dtrain/torch/comm_hook.h"

namespace torch::nn {
class Module;
template <typename Contained>
class ModuleHolder;
}  // namespace torch::nn

namespace dtrain {

struct DdpOptions {
  size_t first_bucket_cap_bytes = size_t{1} << 20;  // 1 MiB: starts communication early
  size_t bucket_cap_bytes = size_t{25} << 20;       // 25 MiB: every later bucket
  bool broadcast_buffers = true;        // rank 0's buffers before each forward that records grads
  bool find_unused_parameters = false;  // forward may skip parameters (costs a graph walk)
  bool rebuild_buckets = true;          // after the first iteration, in gradient arrival order
  // true: each parameter's .grad becomes a view of its slice of the bucket, which saves copying
  // every gradient back after the reduction (and, with zero_grad(/*set_to_none=*/false), into the
  // bucket: backward accumulates in place). As PyTorch's option of that name, a .grad kept across
  // iterations then changes with the bucket, and gradients of parameters in one bucket share
  // storage.
  bool gradient_as_bucket_view = false;
  std::shared_ptr<CommHook> comm_hook;   // null = allreduce_hook()
  std::chrono::milliseconds timeout{0};  // of each collective; 0 = the group's default
};

class Reducer;

class DistributedDataParallel {
 public:
  // Collective: every rank constructs it with the same model. Checks that every rank has the
  // same parameters (names, shapes, dtypes), then copies rank 0's parameters and buffers.
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                          std::shared_ptr<ProcessGroup> group, DdpOptions options = {});
  // A TORCH_MODULE holder (torch::nn::Linear, or your own Net) is taken as it is.
  template <typename Impl>
  DistributedDataParallel(const torch::nn::ModuleHolder<Impl>& module,
                          std::shared_ptr<ProcessGroup> group, DdpOptions options = {})
      : DistributedDataParallel(module.ptr(), std::move(group), std::move(options)) {}
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Runs the module's forward through `fn` with DDP around it; returns what fn returns (a tensor
  // or a vector of tensors, the outputs backward starts from).
  template <typename Forward>
  auto forward(Forward&& fn) {
    pre_forward();
    auto out = fn();
    post_forward(out);
    return out;
  }
  // The two halves of forward(), for callers that run the module themselves.
  void pre_forward();
  void post_forward(const at::Tensor& output);
  void post_forward(const std::vector<at::Tensor>& outputs);

  // While a NoSync is alive, backward accumulates gradients locally without communicating; the
  // first backward after it reduces the accumulated sum.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(&ddp), previous_(ddp.sync_) {
      ddp.sync_ = false;
    }
    ~NoSync() {
      if (ddp_ != nullptr) ddp_->sync_ = previous_;
    }
    NoSync(NoSync&& other) noexcept : ddp_(other.ddp_), previous_(other.previous_) {
      other.ddp_ = nullptr;
    }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;

   private:
    DistributedDataParallel* ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  // Uneven inputs: runs `body` (this rank's training loop). A rank whose body returns early
  // shadows the others' collectives with zero gradients until every rank's body returned; then
  // every rank takes the parameters and buffers of the rank that trained longest. Gradients stay
  // divided by the full world size. Collective: every rank calls join.
  void join(const std::function<void()>& body);

  void set_comm_hook(std::shared_ptr<CommHook> hook);
  // Parameter names per bucket, in reduction order.
  std::vector<std::vector<std::string>> buckets() const;
  torch::nn::Module& module() { return *module_; }
  const std::shared_ptr<ProcessGroup>& group() const { return group_; }

 private:
  struct JoinFlags;
  void broadcast_buffers(int root);
  void broadcast_state(int root);  // parameters and buffers
  void check_same_model();
  void shadow_until_all_joined();

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DdpOptions options_;
  std::unique_ptr<Reducer> reducer_;
  bool sync_ = true;      // false inside no_sync()
  bool joining_ = false;  // inside join(): every forward first tells the others it is alive
  int64_t join_iterations_ = 0;
  std::chrono::steady_clock::time_point forward_start_{};
};

}  // namespace dtrain
