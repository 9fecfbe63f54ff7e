// The nccl backend's ProcessGroup: NCCL collectives on CUDA tensors, one GPU per rank.
//
// Rendezvous through dtrain's store: rank 0 creates the ncclUniqueId and publishes it under the
// group's key ("nccl/<group>/unique_id"); the others wait for it with the connect timeout. Each
// group has its own communicator (sub-groups: ncclCommSplit of their parent's) and its own
// stream; an operation is queued on that stream in call order, after the work queued so far on
// the streams its tensors name (TensorView::stream: the stream current where the caller made
// the view; none, the legacy default stream), and its Work waits for a CUDA event recorded
// after it, one of a pool (nccl_work.h: timeouts abort the communicator). Sends and receives go
// over channels of their own (nccl_p2p.h). gather, scatter, all_to_all(v) are grouped sends and
// receives; all_gather_v is a group of broadcasts; barrier is an all-reduce of one element.
//
// The GPU of a rank: LOCAL_RANK (set by `dtrain run` and torchrun) modulo the GPUs it sees,
// else its rank modulo them. Tensors must be on that GPU.
//
// What NCCL cannot do fails with "backend nccl does not support X on Y": bitwise reductions,
// named algorithms (NCCL picks its own, see NCCL_ALGO), tags other than 0, and host tensors,
// which ProcessGroup::create sends through a native group beside this one instead
// (comm/per_device_group.h). Without a GPU, creating the group fails at once with "backend
// nccl needs a CUDA device: cudaGetDeviceCount returned ...", before any rendezvous.
#pragma once

#include <chrono>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/nccl/nccl_comm.h"
#include "backends/nccl/nccl_p2p.h"
#include "comm/arguments.h"
#include "comm/cuda/cuda_runtime.h"
#include "dtrain/process_group.h"

namespace dtrain::backends::nccl {

class NcclProcessGroup : public ProcessGroup {
 public:
  // The world group: joins the NCCL communicator of `size` ranks through `store`.
  NcclProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                   const ProcessGroupOptions& options);
  // A sub-group over `comm` (split from `parent`'s).
  NcclProcessGroup(const NcclProcessGroup& parent, std::shared_ptr<NcclComm> comm, int rank,
                   int size, std::string name);
  ~NcclProcessGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  // The GPU this rank's communicator is on.
  int device() const { return device_; }

  std::shared_ptr<Work> isend(const TensorView& tensor, int dst, int tag,
                              const SendOptions& options) override;
  std::shared_ptr<Work> irecv(const TensorView& tensor, int src, int tag,
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
  std::shared_ptr<Work> barrier(const BarrierOptions& options) override;
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override;
  void abort(const std::string& reason) override;

 private:
  // Enqueues NCCL calls on the group's communicator and stream.
  using Body = std::function<ncclResult_t(ncclComm_t comm, cudaStream_t stream)>;
  // Issues collective `op` (in call order, numbered) on the group's stream, after the work
  // queued so far on its tensors' `producers` (TensorView::stream).
  std::shared_ptr<Work> collective(const char* op, const std::string& desc,
                                   std::initializer_list<void*> producers,
                                   std::chrono::milliseconds timeout, const Body& body);
  void start();  // the stream, the barrier's element, the p2p channels
  comm::GroupInfo info() const { return {rank_, size_, name_, "nccl", ""}; }
  // A tensor on this rank's GPU, in device memory: the CPU-tensor refusal otherwise.
  void check_cuda(const TensorView& t, const char* op, const char* which) const;
  void check_algorithm(const std::string& algorithm, const char* op) const;
  ncclRedOp_t reduce_op(DType dtype, ReduceOp op, const char* name) const;
  std::chrono::milliseconds limit(std::chrono::milliseconds timeout) const {
    return timeout.count() > 0 ? timeout : timeout_;
  }
  std::shared_ptr<Work> point_to_point(bool send, const TensorView& t, int peer, int tag,
                                       std::chrono::milliseconds timeout);

  std::shared_ptr<Store> store_;       // the group's own (prefixed "nccl/<name>/")
  std::shared_ptr<Store> base_store_;  // the one sub-groups prefix their own keys in
  int rank_;
  int size_;
  std::string name_;
  int device_ = 0;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds connect_timeout_;
  std::shared_ptr<NcclComm> comm_;
  std::unique_ptr<cuda::Stream> stream_;
  std::unique_ptr<cuda::Event> order_;       // orders stream_ after the tensors' producers
  std::shared_ptr<cuda::EventPool> events_;  // each Work's completion event
  std::unique_ptr<cuda::DeviceMemory> one_;  // the barrier's element
  std::shared_ptr<NcclP2p> p2p_;

  std::mutex mu_;  // guards next_seq_, children_, and the use of stream_/order_: held while
                   // issuing, so that collectives reach NCCL in the order of their numbers
  uint32_t next_seq_ = 0;
  uint32_t children_ = 0;
};

}  // namespace dtrain::backends::nccl
