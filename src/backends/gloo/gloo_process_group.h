// The gloo backend's ProcessGroup: Debian's libgloo (the 2022 snapshot, gloo 0.5) over its TCP
// transport, meeting through dtrain's store (GlooStore). Collectives run one at a time, in call
// order, on the group's worker thread (comm::Executor), each with gloo's per-operation timeout
// set from its deadline; sends and receives use gloo's unbound buffers (gloo_p2p_work.h).
//
// What gloo cannot do fails with "backend gloo does not support X on Y": bf16 reductions (this
// gloo has no bfloat16 type), CUDA tensors (this gloo is built without CUDA), algorithms other
// than gloo's own. A collective that fails or times out leaves gloo's pairs in an unknown state
// (gloo closes every pair of the context on a timeout), so the group is unusable afterwards.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gloo/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>

#include "backends/group_failure.h"
#include "comm/arguments.h"
#include "comm/executor.h"
#include "common/deadline.h"
#include "dtrain/process_group.h"

namespace dtrain::backends {

class GlooP2pWork;

class GlooProcessGroup : public ProcessGroup {
 public:
  // The world group: a TCP device and a full mesh through `store`.
  GlooProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                   const ProcessGroupOptions& options);
  // A sub-group: `rank` of `size` with its own gloo context over `parent`'s device.
  GlooProcessGroup(const GlooProcessGroup& parent, int rank, int size, std::string name);
  ~GlooProcessGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

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
  // What a collective gets to run: gloo's tag for it (its sequence number) and the time left.
  struct Slot {
    uint32_t tag;
    std::chrono::milliseconds timeout;
  };
  using Body = std::function<void(const Slot&)>;
  // Queues `body` as collective `op`; `describe` is "f32 x 1024 (4096 bytes)".
  std::shared_ptr<Work> submit(const char* op, std::string describe,
                               std::chrono::milliseconds timeout, Body body);
  void connect(gloo::rendezvous::Store& store, std::chrono::milliseconds connect_timeout);
  comm::GroupInfo info() const {
    return {rank_, size_, name_, "gloo", "Debian's gloo is built without CUDA"};
  }
  void check_algorithm(const std::string& algorithm, const char* op) const;
  void check_reducible(DType dtype, ReduceOp op, const char* name) const;
  std::chrono::milliseconds limit(std::chrono::milliseconds timeout) const {
    return timeout.count() > 0 ? timeout : timeout_;
  }
  void mark_failed(std::exception_ptr error);

  std::shared_ptr<Store> store_;  // the base store; each group prefixes its own keys
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  int rank_;
  int size_;
  std::string name_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds connect_timeout_;
  std::shared_ptr<comm::Executor> executor_;

  std::mutex mu_;  // guards next_seq_, children_, failure_
  uint32_t next_seq_ = 0;
  uint32_t children_ = 0;
  // Set once a collective failed or abort() was called; the sends and receives abort() cancels.
  GroupFailure<GlooP2pWork> failure_;
};

}  // namespace dtrain::backends
