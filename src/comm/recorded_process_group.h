// The calls of a group whose backend keeps no flight record of its own (gloo, MPI, NCCL), put in
// the flight recorder (flight_recorder.h) as the native backend puts its own: each call as it is
// made, numbered in the group's order, and its end when its Work is seen to finish (waited for,
// or found completed). ProcessGroup::create wraps every such backend's group in one.
#pragma once

#include <atomic>
#include <memory>

#include "comm/flight_recorder.h"
#include "dtrain/process_group.h"

namespace dtrain::comm {

class RecordedProcessGroup final : public ProcessGroup {
 public:
  // `world`: the job's group, whose rank names this process's record.
  RecordedProcessGroup(std::shared_ptr<ProcessGroup> inner, bool world);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }

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
  std::shared_ptr<Work> barrier(const BarrierOptions& options) override;
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override;
  void abort(const std::string& reason) override { inner_->abort(reason); }

 private:
  // Records `call`, runs `run` (the inner group's call) and follows the Work it returns.
  template <typename Run>
  std::shared_ptr<Work> recorded(const FlightCall& call, Run run);
  // The collective `call`, numbered in this group's order.
  template <typename Run>
  std::shared_ptr<Work> collective(CollectiveCall call, const void* caller, Run run);
  template <typename Run>
  std::shared_ptr<Work> p2p(FlightCall::Kind kind, size_t bytes, int peer, int tag,
                            const void* caller, Run run);

  std::shared_ptr<ProcessGroup> inner_;
  uint16_t flight_group_;
  std::atomic<uint32_t> next_seq_{0};
};

}  // namespace dtrain::comm
