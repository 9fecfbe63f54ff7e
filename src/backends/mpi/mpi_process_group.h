// The mpi backend's ProcessGroup: OpenMPI (or any MPI-3 library) under mpirun. Ranks and
// rendezvous are mpirun's, so it needs no store: the world group is a duplicate of
// MPI_COMM_WORLD, sub-groups are MPI_Comm_split of their parent. Every operation is a
// non-blocking MPI call (MPI_Isend/Irecv, MPI_Iallreduce, ...) whose Work polls MPI_Test with
// a deadline (mpi_work.h), since MPI itself has no timeouts.
//
// What MPI cannot do fails with "backend mpi does not support X on Y": reductions of f16 and
// bf16 (MPI has no 16-bit float types; moving them is fine), CUDA tensors (Debian's OpenMPI is
// not CUDA-aware), more than 2^31-1 elements in one call, named algorithms (MPI picks its own).
#pragma once

#include <mpi.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/group_failure.h"
#include "backends/mpi/mpi_work.h"
#include "comm/arguments.h"
#include "dtrain/process_group.h"

namespace dtrain::backends::mpi {

class MpiProcessGroup : public ProcessGroup, public std::enable_shared_from_this<MpiProcessGroup> {
 public:
  // The world group. rank and size, when not -1, must be what mpirun gave this process.
  MpiProcessGroup(int rank, int size, const ProcessGroupOptions& options);
  // A sub-group over `comm` (taken over: freed with the group).
  MpiProcessGroup(MPI_Comm comm, std::string name, std::chrono::milliseconds timeout);
  ~MpiProcessGroup() override;

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
  using Start = std::function<int(MpiWork&)>;  // issues the MPI_I* call; returns its code
  // Issues one collective (or p2p operation, for kind != kCollective) in call order.
  std::shared_ptr<Work> start(MpiWork::Kind kind, const char* op, const std::string& desc,
                              std::chrono::milliseconds timeout, const Start& body);
  comm::GroupInfo info() const {
    return {rank_, size_, name_, "mpi", "Debian's OpenMPI is not CUDA-aware"};
  }
  void check_algorithm(const std::string& algorithm, const char* op) const;
  int check_count(size_t count, const char* op) const;
  // MPI's type for a reduction over dtype; the named error for f16/bf16.
  MPI_Datatype reduction_type(DType dtype, ReduceOp op, const char* name) const;
  void mark_failed(std::exception_ptr error);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::string name_;
  std::chrono::milliseconds timeout_;

  std::mutex mu_;  // guards next_seq_, children_, failure_; held while issuing
  uint32_t next_seq_ = 0;
  uint32_t children_ = 0;
  // Set once an operation was abandoned or abort() was called; what abort() must end.
  GroupFailure<MpiWork> failure_;
};

}  // namespace dtrain::backends::mpi
