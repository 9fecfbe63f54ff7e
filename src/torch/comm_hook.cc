// The built-in communication hooks: average in place, with 16, 8 or 4 bits a value on the wire.
#include "dtrain/torch/comm_hook.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/torch/tensor_view.h"

namespace dtrain {

namespace {

class AllreduceHook : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  std::shared_ptr<Work> start(ProcessGroup& group, GradBucket& bucket,
                              std::chrono::milliseconds timeout) override {
    AllreduceOptions options;
    options.op = ReduceOp::kSum;
    options.timeout = timeout;
    return group.allreduce(dtrain::view_of(bucket.buffer), options);
  }
  // An average after the sum would be one more pass over every bucket, on the cores backward
  // computes on.
  bool sums_divided_gradients() const override { return true; }
};

// Averages with `wire` on the wire (AllreduceOptions::wire): the casts are folded into the
// exchange, and the bucket's scratch holds the error feedback (zeros until the first call, and
// again whenever the bucket's size changes).
std::shared_ptr<Work> start_on_wire(ProcessGroup& group, GradBucket& bucket, Wire wire,
                                    std::chrono::milliseconds timeout) {
  if (!bucket.scratch.defined() || bucket.scratch.numel() != bucket.buffer.numel() ||
      bucket.scratch.scalar_type() != at::kFloat)
    bucket.scratch = at::zeros({bucket.buffer.numel()}, bucket.buffer.options());
  AllreduceOptions options;
  options.op = ReduceOp::kAvg;
  options.timeout = timeout;
  options.wire = wire;
  options.error = dtrain::view_of(bucket.scratch);
  return group.allreduce(dtrain::view_of(bucket.buffer), options);
}

// 16 bits a value: on the wire where the group has it (the native backend, f32 gradients), else
// cast down, averaged, cast back (the reduction itself runs in f32 inside the backend's kernels,
// so only the rounding of the inputs and of the result is lost).
class CompressHook : public CommHook {
 public:
  CompressHook(at::ScalarType type, Wire wire, std::string name)
      : type_(type), wire_(wire), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  std::shared_ptr<Work> start(ProcessGroup& group, GradBucket& bucket,
                              std::chrono::milliseconds timeout) override {
    if (bucket.buffer.scalar_type() == at::kFloat && !refused_) {
      try {
        return start_on_wire(group, bucket, wire_, timeout);
      } catch (const InvalidArgumentError&) {
        // Only the backend refuses f32 averages with a well-formed error buffer: gloo, mpi and
        // nccl have no such wire. Asked once; the cast serves from here on.
        refused_ = true;
      }
    }
    if (!bucket.scratch.defined() || bucket.scratch.numel() != bucket.buffer.numel() ||
        bucket.scratch.scalar_type() != type_)
      bucket.scratch = at::empty({bucket.buffer.numel()}, bucket.buffer.options().dtype(type_));
    bucket.scratch.copy_(bucket.buffer);
    AllreduceOptions options;
    options.op = ReduceOp::kAvg;
    options.timeout = timeout;
    return group.allreduce(dtrain::view_of(bucket.scratch), options);
  }
  // A bucket that went the cast's way holds its 16-bit copy in scratch (one on the wire, f32
  // error feedback); buckets of several types may be in flight at once.
  void finish(GradBucket& bucket) override {
    if (bucket.scratch.scalar_type() == type_) bucket.buffer.copy_(bucket.scratch);
  }

 private:
  at::ScalarType type_;
  Wire wire_;
  std::string name_;
  bool refused_ = false;  // the group has no such wire
};

// Averages with int8 or int4 on the wire: f32 gradients on the native backend only.
class QuantizeHook : public CommHook {
 public:
  explicit QuantizeHook(Wire wire) : wire_(wire) {}
  std::string name() const override { return fmt::format("{}_compress", to_string(wire_)); }
  std::shared_ptr<Work> start(ProcessGroup& group, GradBucket& bucket,
                              std::chrono::milliseconds timeout) override {
    return start_on_wire(group, bucket, wire_, timeout);
  }

 private:
  Wire wire_;
};

}  // namespace

std::shared_ptr<CommHook> allreduce_hook() { return std::make_shared<AllreduceHook>(); }
std::shared_ptr<CommHook> fp16_compress_hook() {
  return std::make_shared<CompressHook>(at::kHalf, Wire::kFp16, "fp16_compress");
}
std::shared_ptr<CommHook> bf16_compress_hook() {
  return std::make_shared<CompressHook>(at::kBFloat16, Wire::kBf16, "bf16_compress");
}
std::shared_ptr<CommHook> int8_compress_hook() {
  return std::make_shared<QuantizeHook>(Wire::kInt8);
}
std::shared_ptr<CommHook> int4_compress_hook() {
  return std::make_shared<QuantizeHook>(Wire::kInt4);
}

}  // namespace dtrain
