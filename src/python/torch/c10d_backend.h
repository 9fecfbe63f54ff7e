// C10dBackend: dtrain's native process group as a torch 2.x c10d::Backend, registered as the
// backend "dtrain" for the devices cpu and cuda by `import dtrain.torch` (or torch's entry point).
//
// torch's ProcessGroup dispatches each operation to the Backend registered for the tensors'
// device, so functional collectives, DTensor, FSDP2, DeviceMesh and the coalescing manager reach
// it as well as torch.distributed's own calls. Every torch group, the default one and each
// new_group, is a dtrain group of its own that meets its members through the store torch hands
// the backend (a PrefixStore per group): torch calls the backend only on the members of a new
// group, which is all such a group needs.
//
// Contiguous tensors go to dtrain as they are (no copy; CUDA ones staged, or on the NCCL backend
// where built); torch's list forms (all_gather into a list, scatter from one, reduce_scatter,
// alltoall of lists, the coalesced forms) go through one staging buffer and are copied out when
// the operation succeeds. Every operation is asynchronous: its C10dWork is waited on by torch (or
// by DDP through its future). Between startCoalescing and endCoalescing the operations run as
// they come, and endCoalescing returns one Work that ends when all of them have.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "dtrain/process_group.h"

namespace dtrain::python {

class FutureCompleter;
class C10dWork;

class C10dBackend : public c10d::Backend {
 public:
  struct GroupOptions {
    std::string name = "world";  // names the group in errors: "collective #3 of group world"
    // 0 = DTRAIN_TIMEOUT's default (python/dtrain/torch/backend.py maps torch's defaults to it)
    std::chrono::milliseconds timeout{0};
    // How long the members may take to connect; 0 = timeout.
    std::chrono::milliseconds connect_timeout{0};
  };
  C10dBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
              const GroupOptions& options);
  ~C10dBackend() override;

  const std::string getBackendName() const override { return "dtrain"; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override { return options_; }
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  // The group's default for operations that set no timeout of their own.
  void setTimeout(std::chrono::milliseconds timeout) override;
  // Fails every pending and later operation of the group on every thread (torch's abort).
  void abort() override;
  // The dtrain group underneath (its own tests and tools use it directly).
  dtrain::ProcessGroup& group() { return *pg_; }
  const std::shared_ptr<dtrain::ProcessGroup>& shared_group() const { return pg_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  // Averages `tensor` (f32, contiguous) with `wire` (not kExact) on the wire; `error` is its error
  // feedback (f32 of the same numel, kept by the caller) or undefined. The comm hooks'
  // (python/dtrain/torch/comm_hooks.py).
  c10::intrusive_ptr<c10d::Work> allreduce_compressed(const at::Tensor& tensor, Wire wire,
                                                      const at::Tensor& error);
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  // outputs[r][i]: rank r's copy of input i.
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  // What DTensor sends even for one tensor: all_gather_into_tensor of each pair, as one.
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
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
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
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

  // An operation as errors name it ("all_reduce on rank 1 of group world"), formatted only then.
  struct OpSite {
    const char* op;
    int rank;
    const std::string& group;
  };

 private:
  OpSite site(const char* op) const { return {op, rank_, pg_->name()}; }
  // A new Work for one operation; while coalescing, also remembered for endCoalescing.
  c10::intrusive_ptr<C10dWork> make_work(c10d::OpType type, const char* title, bool collective);
  // An operation's timeout: its own, else setTimeout's, else 0 (the dtrain group's default).
  std::chrono::milliseconds timeout_of(std::chrono::milliseconds t) const;

  std::shared_ptr<dtrain::ProcessGroup> pg_;
  std::shared_ptr<FutureCompleter> completer_;
  c10::intrusive_ptr<c10d::Backend::Options> options_;
  std::atomic<uint64_t> seq_{0};
  std::atomic<std::chrono::milliseconds> default_timeout_{std::chrono::milliseconds(0)};
  // The works made since startCoalescing; torch calls both ends from the thread that issues the
  // operations, so no lock (nullopt: not coalescing).
  std::optional<std::vector<c10::intrusive_ptr<C10dWork>>> coalesced_;
};

// The dtrain group under `backend` (torch's Backend object of a group made with backend
// "dtrain"); null for a null backend. InvalidArgumentError naming `what` for another backend.
std::shared_ptr<dtrain::ProcessGroup> dtrain_group(const c10::intrusive_ptr<c10d::Backend>& backend,
                                                   const char* what);

}  // namespace dtrain::python
