// Communication hooks: how DistributedDataParallel reduces one bucket of gradients.
//
//   ddp.set_comm_hook(dtrain::fp16_compress_hook());   // half the bytes on the wire
//
// A hook starts the bucket's communication (returning its Work, which DDP waits on when the
// step needs the result) and, once it completed, leaves the *average over ranks* of the
// gradients in bucket.buffer. The built-in hooks: plain all-reduce (the default); fp16/bf16
// compression, 2x fewer bytes: on the native backend with f32 gradients the values cross the
// wire in 16 bits with error feedback, the casts folded into the exchange (Wire::kFp16, kBf16
// in process_group.h), and elsewhere they are cast down, all-reduced and cast back; and int8 on
// the wire with error feedback (f32 gradients on the native backend; Wire::kInt8: 3.9x fewer
// bytes than f32), and int4 likewise (Wire::kInt4: 7.8x fewer). Every replica ends with the same
// gradients.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dtrain/process_group.h"

namespace dtrain {

struct GradBucket {
  size_t index = 0;                          // buckets are reduced in index order on every rank
  at::Tensor buffer;                         // flat gradients of the bucket's parameters
  std::vector<std::string> parameter_names;  // in the order of their slices in buffer
  at::Tensor scratch;                        // the hook's own per-bucket memory (e.g. fp16 copy)
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  // Starts reducing bucket.buffer over `group` (asynchronously) and returns the Work.
  virtual std::shared_ptr<Work> start(ProcessGroup& group, GradBucket& bucket,
                                      std::chrono::milliseconds timeout) = 0;
  // Called after the Work completed: leaves the averaged gradients in bucket.buffer.
  virtual void finish(GradBucket& bucket) {}
  // True when start() sums the bucket over ranks and expects each gradient in it divided by the
  // group's size already: DDP divides as it copies a gradient into its bucket, so the average
  // costs no pass over the bucket of its own (PyTorch's DDP does the same without a hook).
  virtual bool sums_divided_gradients() const { return false; }
};

std::shared_ptr<CommHook> allreduce_hook();
std::shared_ptr<CommHook> fp16_compress_hook();
std::shared_ptr<CommHook> bf16_compress_hook();
std::shared_ptr<CommHook> int8_compress_hook();
std::shared_ptr<CommHook> int4_compress_hook();

}  // namespace dtrain
