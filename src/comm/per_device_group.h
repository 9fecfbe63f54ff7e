// One group made of two: each call goes to the group for the device its tensors are on, CUDA
// tensors to `cuda` (the nccl backend's group), host tensors to `host` (a native group of the
// same ranks). What torch's "cpu:gloo,cuda:nccl" does: ProcessGroup::create makes one for a
// backend that moves device memory only (Backend::device_memory_only), so that a job whose
// gradients go through NCCL still runs dtrain's own collectives on host memory (DDP's agreement
// on its buckets, a checkpoint's status, a trainer's metrics).
//
// Each of the two keeps its own order and sequence numbers. A call's tensors must all be on one
// side (the others are refused before anything moves), and every rank must pass the same call
// tensors on the same side: a rank that passes a host tensor where another passes a CUDA one
// waits in the other group until its timeout, which names both groups' calls.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/process_group.h"

namespace dtrain::comm {

class PerDeviceGroup final : public ProcessGroup {
 public:
  // Both of the same ranks, in the same order.
  PerDeviceGroup(std::shared_ptr<ProcessGroup> cuda, std::shared_ptr<ProcessGroup> host);

  int rank() const override { return cuda_->rank(); }
  int size() const override { return cuda_->size(); }
  const std::string& name() const override { return cuda_->name(); }
  std::chrono::milliseconds timeout() const override { return cuda_->timeout(); }
  ProcessGroup& cuda_group() { return *cuda_; }
  ProcessGroup& host_group() { return *host_; }

  std::shared_ptr<Work> isend(const TensorView& tensor, int dst, int tag,
                              const SendOptions& options) override;
  std::shared_ptr<Work> irecv(const TensorView& tensor, int src, int tag,
                              const RecvOptions& options) override;
  std::shared_ptr<Work> irecv_any(const TensorView& tensor, int tag,
                                  const RecvOptions& options) override;
  std::shared_ptr<Work> broadcast(const TensorView& tensor,
                                  const BroadcastOptions& options) override;
  std::shared_ptr<Work> allreduce(const TensorView& tensor,
                                  const AllreduceOptions& options) override;
  using ProcessGroup::allreduce;
  std::shared_ptr<Work> reduce(const TensorView& tensor, const ReduceOptions& options) override;
  std::shared_ptr<Work> allgather(const TensorView& output, const TensorView& input,
                                  const AllgatherOptions& options) override;
  std::shared_ptr<Work> allgatherv(const TensorView& output, const TensorView& input,
                                   const std::vector<size_t>& counts,
                                   const AllgatherOptions& options) override;
  std::shared_ptr<Work> gather(const TensorView& output, const TensorView& input,
                               const GatherOptions& options) override;
  std::shared_ptr<Work> scatter(const TensorView& output, const TensorView& input,
                                const ScatterOptions& options) override;
  std::shared_ptr<Work> reduce_scatter(const TensorView& output, const TensorView& input,
                                       const ReduceScatterOptions& options) override;
  std::shared_ptr<Work> alltoall(const TensorView& output, const TensorView& input,
                                 const AlltoallOptions& options) override;
  std::shared_ptr<Work> alltoallv(const TensorView& output,
                                  const std::vector<size_t>& output_counts, const TensorView& input,
                                  const std::vector<size_t>& input_counts,
                                  const AlltoallOptions& options) override;
  // On the host group: the processes meet; work already queued on a GPU is not waited for.
  std::shared_ptr<Work> barrier(const BarrierOptions& options) override;
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override;
  void abort(const std::string& reason) override;

 private:
  // The group for the call's tensors (host views without memory, such as a non-root's unused
  // output, do not count; none at all: the host group). Throws InvalidArgumentError when some
  // are on a GPU and others not.
  ProcessGroup& route(std::string_view op, std::initializer_list<const TensorView*> tensors);

  std::shared_ptr<ProcessGroup> cuda_;
  std::shared_ptr<ProcessGroup> host_;
};

}  // namespace dtrain::comm
