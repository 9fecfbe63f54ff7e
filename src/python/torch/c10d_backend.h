// C10dProcessGroup: dtrain's native process group behind torch.distributed's ProcessGroup API
// (torch 1.13), registered as the backend "dtrain" by `import dtrain.torch`.
//
// Every torch group, the default one and each new_group, is a dtrain group of its own that meets
// its members through the store torch hands the backend (a PrefixStore per group): torch calls the
// backend only on the members of a new group, which is all such a group needs.
//
// Contiguous CPU tensors go to dtrain as they are (no copy); torch's list forms (all_gather into a
// list, scatter from one, reduce_scatter, alltoall of lists) go through one staging buffer and
// are copied out when the operation succeeds. Every operation is asynchronous: its C10dWork is
// waited on by torch (or by DDP through its future).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "dtrain/process_group.h"

namespace dtrain::python {

class FutureCompleter;
class C10dWork;

class C10dProcessGroup : public c10d::ProcessGroup {
 public:
  struct Options {
    std::string name = "world";  // names the group in errors: "collective #3 of group world"
    // 0 = DTRAIN_TIMEOUT's default; torch's own default of 30 minutes maps to it as well
    std::chrono::milliseconds timeout{0};
  };
  C10dProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   const Options& options);
  ~C10dProcessGroup() override;

  const std::string getBackendName() const override { return "dtrain"; }
  // The dtrain group underneath (its own tests and tools use it directly).
  dtrain::ProcessGroup& group() { return *pg_; }
  const std::shared_ptr<dtrain::ProcessGroup>& shared_group() const { return pg_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  // A barrier whose failure names the ranks that did not arrive (dtrain's post-mortem).
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  // Every member starts at 0 and counts the collectives it issued, so no agreement is needed.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

 private:
  c10::intrusive_ptr<C10dWork> make_work(c10d::OpType type, const char* title, bool collective);

  std::shared_ptr<dtrain::ProcessGroup> pg_;
  std::shared_ptr<FutureCompleter> completer_;
  std::atomic<uint64_t> seq_{0};
};

}  // namespace dtrain::python
