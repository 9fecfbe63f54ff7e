// The built-in communication hooks: average in place, or through a 16-bit copy.
#include "dtrain/torch/comm_hook.h"

#include <ATen/ATen.h>

#include "dtrain/torch/tensor_view.h"

namespace dtrain {

namespace {

class AllreduceHook : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  std::shared_ptr<Work> start(ProcessGroup& group, GradBucket& bucket,
                              std::chrono::milliseconds timeout) override {
    AllreduceOptions options;
    options.op = ReduceOp::kAvg;
    options.timeout = timeout;
    return group.allreduce(dtrain::view_of(bucket.buffer), options);
  }
};

// Casts to a 16-bit type, averages that, casts back. The reduction itself runs in f32 inside
// dtrain's kernels, so only the rounding of the inputs and of the result is lost.
class CompressHook : public CommHook {
 public:
  CompressHook(at::ScalarType type, std::string name) : type_(type), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  std::shared_ptr<Work> start(ProcessGroup& group, GradBucket& bucket,
                              std::chrono::milliseconds timeout) override {
    if (!bucket.scratch.defined() || bucket.scratch.numel() != bucket.buffer.numel() ||
        bucket.scratch.scalar_type() != type_)
      bucket.scratch = at::empty({bucket.buffer.numel()}, bucket.buffer.options().dtype(type_));
    bucket.scratch.copy_(bucket.buffer);
    AllreduceOptions options;
    options.op = ReduceOp::kAvg;
    options.timeout = timeout;
    return group.allreduce(dtrain::view_of(bucket.scratch), options);
  }
  void finish(GradBucket& bucket) override { bucket.buffer.copy_(bucket.scratch); }

 private:
  at::ScalarType type_;
  std::string name_;
};

}  // namespace

std::shared_ptr<CommHook> allreduce_hook() { return std::make_shared<AllreduceHook>(); }
std::shared_ptr<CommHook> fp16_compress_hook() {
  return std::make_shared<CompressHook>(at::kHalf, "fp16_compress");
}
std::shared_ptr<CommHook> bf16_compress_hook() {
  return std::make_shared<CompressHook>(at::kBFloat16, "bf16_compress");
}

}  // namespace dtrain
