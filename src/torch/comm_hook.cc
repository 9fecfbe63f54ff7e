// The built-in communication hooks: average in place, through a 16-bit copy, or as int8.
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

// Averages with int8 on the wire (Wire::kInt8); the bucket's scratch holds its error feedback,
// zeros until the first call (and again whenever the bucket's size changes).
class Int8CompressHook : public CommHook {
 public:
  std::string name() const override { return "int8_compress"; }
  std::shared_ptr<Work> start(ProcessGroup& group, GradBucket& bucket,
                              std::chrono::milliseconds timeout) override {
    if (!bucket.scratch.defined() || bucket.scratch.numel() != bucket.buffer.numel() ||
        bucket.scratch.scalar_type() != at::kFloat)
      bucket.scratch = at::zeros({bucket.buffer.numel()}, bucket.buffer.options());
    AllreduceOptions options;
    options.op = ReduceOp::kAvg;
    options.timeout = timeout;
    options.wire = Wire::kInt8;
    options.error = dtrain::view_of(bucket.scratch);
    return group.allreduce(dtrain::view_of(bucket.buffer), options);
  }
};

}  // namespace

std::shared_ptr<CommHook> allreduce_hook() { return std::make_shared<AllreduceHook>(); }
std::shared_ptr<CommHook> fp16_compress_hook() {
  return std::make_shared<CompressHook>(at::kHalf, "fp16_compress");
}
std::shared_ptr<CommHook> bf16_compress_hook() {
  return std::make_shared<CompressHook>(at::kBFloat16, "bf16_compress");
}
std::shared_ptr<CommHook> int8_compress_hook() { return std::make_shared<Int8CompressHook>(); }

}  // namespace dtrain
