// Reducer: DDP's gradient buckets, the autograd hooks that fill them, and their reduction.
// Internal to dtrain_torch; DistributedDataParallel owns one.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dtrain/process_group.h"
#include "dtrain/torch/comm_hook.h"
#include "torch/autograd_node.h"

namespace dtrain {

struct ReducerOptions {
  size_t first_bucket_cap_bytes = size_t{1} << 20;
  size_t bucket_cap_bytes = size_t{25} << 20;
  bool find_unused_parameters = false;
  bool rebuild_buckets = true;
  bool gradient_as_bucket_view = false;
  std::chrono::milliseconds timeout{0};
};

class Reducer {
 public:
  Reducer(std::vector<std::string> names, std::vector<at::Tensor> params,
          std::shared_ptr<ProcessGroup> group, std::shared_ptr<CommHook> hook,
          ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Called after a forward whose backward must reduce: arms the hooks and, with
  // find_unused_parameters, marks the parameters `outputs` do not depend on as ready (zeros).
  void prepare_for_backward(const std::vector<at::Tensor>& outputs);
  // Called after a forward inside no_sync(): hooks stay idle, gradients accumulate locally.
  void prepare_for_local_backward();
  // Called before each forward: finishes what a forward without backward left armed.
  void prepare_for_forward();

  // Rebuilding buckets in arrival order is due (the first synced backward has finished).
  bool rebuild_pending() const { return rebuild_pending_; }
  // Collective: rank 0 broadcasts the order its gradients arrived in; every rank rebuilds.
  void rebuild_buckets();
  // A joined rank's share of one synced backward of the others: zeros in every bucket.
  void shadow_backward();

  void set_comm_hook(std::shared_ptr<CommHook> hook) { hook_ = std::move(hook); }
  std::vector<std::vector<std::string>> bucket_names() const;

 private:
  struct Bucket;
  void build_buckets(const std::vector<size_t>& order);
  void on_grad_ready(size_t param);
  void mark_ready(size_t param, bool used);
  void launch_ready_buckets();
  void finalize_backward();
  void wait_bucket(Bucket& bucket);
  // The slice of parameter p's bucket that holds its gradient, shaped as the parameter.
  at::Tensor slot(size_t p) const;
  // The parameter's .grad is that slice itself (gradient_as_bucket_view).
  bool grad_is_slot(size_t p, const at::Tensor& slot) const;
  std::string describe_missing() const;

  std::vector<std::string> names_;
  std::vector<at::Tensor> params_;
  std::shared_ptr<ProcessGroup> group_;
  std::shared_ptr<CommHook> hook_;
  ReducerOptions options_;

  std::vector<AutogradNodePtr> accumulators_;  // keeps the hooks alive
  std::vector<uintptr_t> hook_keys_;

  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<size_t> bucket_of_;  // param -> bucket
  std::vector<size_t> slot_of_;    // param -> index within its bucket

  // One backward's state; the hooks and the end-of-backward callback run on the backward
  // thread, so no lock is needed.
  bool expect_hooks_ = false;     // armed by prepare_for_backward
  bool callback_queued_ = false;  // finalize_backward queued on the autograd engine
  size_t next_to_launch_ = 0;     // buckets start strictly in index order
  std::vector<uint8_t> ready_;    // param -> marked ready this backward
  std::vector<int32_t> used_;     // param -> got a gradient this backward (find_unused)
  std::vector<size_t> arrival_;   // param indices in the order their gradients arrived
  bool rebuild_pending_ = false;
  bool rebuilt_ = false;
  std::chrono::steady_clock::time_point backward_start_{};
};

}  // namespace dtrain
