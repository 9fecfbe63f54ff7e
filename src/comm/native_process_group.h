// The native backend's ProcessGroup: dtrain's own TCP transport and collective algorithms.
// The world group owns the device (one connection per peer); sub-groups share it, with their
// own group id in every tag, their own sequence numbers and their own worker thread.
#pragma once

#include <array>
#include <atomic>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/arguments.h"
#include "comm/call_history.h"
#include "comm/collective.h"
#include "comm/cost_model.h"
#include "comm/cuda_staging.h"
#include "comm/executor.h"
#include "comm/flight_recorder.h"
#include "comm/hierarchy_plan.h"
#include "comm/postmortem.h"
#include "comm/watchdog.h"
#include "dtrain/process_group.h"
#include "transport/device.h"

namespace dtrain::comm {

class NativeProcessGroup : public ProcessGroup,
                           public std::enable_shared_from_this<NativeProcessGroup> {
 public:
  // The world group: connects the device.
  NativeProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                     const ProcessGroupOptions& options);
  // How a group may split its ranks for the hierarchical collectives (comm/hierarchy_plan.h).
  using Split = comm::Split;
  // A sub-group over world ranks `members` sharing `parent`'s device. The groups dtrain makes for
  // itself (the hierarchy's parts and cross groups) say how they may split further.
  NativeProcessGroup(const NativeProcessGroup& parent, std::vector<int> members, uint32_t group_id,
                     std::string name, Split split = Split::kHostsOrRacks);
  ~NativeProcessGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

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
  void abort(const std::string& reason) override;

  // Ping-pong with a peer of each class of link (link_calibration.cc); every rank of the group
  // calls it and gets rank 0's figures. `dtrain bench --calibrate` writes them to a file.
  CostConstants measure_links(CostConstants defaults);
  void set_cost_constants(const CostConstants& k);  // this group's and its hierarchy's
  const CostModel& cost_model() const { return cost_model_; }
  const Topology& topology() const { return topology_; }
  // How the group split for the hierarchical collectives, and its cross group: "split=hosts
  // parts=2 per_part=2 uniform; cross: split=racks ..." ("split=none" where it did not).
  std::string hierarchy() const;
  // The algorithm the next `kind` collective of `bytes` would use (for benchmarks and logs).
  std::string algorithm_for(CollectiveKind kind, std::string_view requested, size_t bytes) const;

 private:
  // The steps every collective repeats. Each public collective checks its arguments (and hands
  // CUDA tensors to on_host), then calls collective(), which chooses the algorithm, submits a
  // run of it, and divides an average where the result lands.
  //
  // Where each rank's block lies in a buffer of blocks in rank order (bytes).
  struct Blocks {
    std::vector<size_t> offsets, sizes;
    static Blocks equal(int ranks, size_t block);
    static Blocks of(const std::vector<size_t>& counts, size_t element_size);
  };
  // What a collective hands its algorithm (algo::Invocation), less the context the run makes.
  struct Args {
    TensorView out, in;
    ReduceOp op = ReduceOp::kSum;
    int root = 0;
    Blocks out_blocks, in_blocks;  // all-gather(-v), all-to-all(-v)
  };
  // Chooses the algorithm (`options.algorithm` where the options have one, else the cost
  // model's for `bytes`) and submits a run of it with `args`: on the executor for async_op,
  // on this thread otherwise. For ReduceOp::kAvg the result is divided by the group's size on
  // every rank, or on the root of a reduce.
  template <typename Options>
  // `caller`: the return address in the code that called this group (the flight record's).
  std::shared_ptr<Work> collective(const CollectiveCall& call, const Options& options, size_t bytes,
                                   Args args, const void* caller);
  // A call on CUDA tensors: `again` (the same call) on host copies of them, through the
  // installed staging (cuda_staging.h), with what is left of the call's timeout.
  template <typename Options, typename Again>
  std::shared_ptr<Work> on_host(std::string_view op, std::initializer_list<StagedTensor> tensors,
                                const Options& options, Again again);
  // Numbers the call and runs `body` (a callable taking the CollectiveContext): at once on this
  // thread for a synchronous call with nothing ahead of it (Executor::run_inline: no work
  // object, no function object, no queue), else through the executor.
  template <typename Body>
  std::shared_ptr<Work> submit(const CollectiveCall& call, std::string_view algorithm,
                               std::chrono::milliseconds timeout, bool async_op, Body body,
                               const void* caller = nullptr);
  // One run of a collective: its context, the fingerprint check, the watchdog, the agreement
  // of rooted collectives, and on failure the post-mortem. `queued`: it waited in the executor's
  // queue (else it runs as it was called).
  template <typename Body>
  void run_collective(const CollectiveWork::Label& label, Deadline deadline,
                      std::string_view algorithm, const std::exception_ptr& mismatched, Body& body,
                      bool queued);
  GroupInfo info() const { return {rank_, size_, name_, "native", "not yet"}; }
  // A collective of this group failed here: mark the group unusable and tell the peers (once).
  void on_collective_failed(uint32_t seq, std::exception_ptr error);
  // What went wrong with collective `seq` everywhere, from the store (see postmortem.h).
  std::string postmortem(uint32_t seq, const std::string& entry);
  // ": rank 1's process failed with exit code 1 (dtrain run)" for the peers whose connection
  // closed and whose launcher says they failed; "" otherwise.
  std::string peers_failed() const;
  void start();
  Deadline deadline_for(std::chrono::milliseconds timeout) const {
    return Deadline::after(timeout.count() > 0 ? timeout : timeout_);
  }
  transport::Pair& pair_of(int group_rank) const { return *device_->pair(members_[group_rank]); }

  std::shared_ptr<Store> store_;
  std::shared_ptr<transport::Device> device_;
  int rank_;
  int size_;
  std::string name_;
  std::vector<int> members_;             // world rank of each group rank
  std::vector<transport::Pair*> pairs_;  // to each group rank (null for self), from start()
  uint32_t group_id_ = 0;
  std::chrono::milliseconds timeout_;
  std::chrono::microseconds async_grace_{0};  // ProcessGroupOptions::async_grace
  CostModel cost_model_;
  double oversubscription_ = 1.0;  // ranks on this host per core (the cost model's view)
  // The cost model's choice, remembered per (kind, bytes) for the latest few.
  const algo::Algorithm& choose(CollectiveKind kind, std::string_view requested,
                                size_t bytes) const;
  // Each a whole choice in one word, read and written without a lock (a small collective's
  // call takes no lock it can do without): the bytes, the kind and the algorithm's place in
  // algo::registry() plus one; 0 when empty.
  mutable std::array<std::atomic<uint64_t>, 16> choices_{};
  void forget_choices();
  Topology topology_;
  Split split_ = Split::kHostsOrRacks;
  bool internal() const { return split_ != Split::kHostsOrRacks; }
  // Split into hosts or racks (see algorithms/allreduce_hierarchical.cc): this rank's part, and
  // the cross group it belongs to (null for a rank that is not a leader of uneven parts).
  std::shared_ptr<NativeProcessGroup> local_group_;
  std::shared_ptr<NativeProcessGroup> cross_group_;
  algo::Hierarchy hierarchy_;
  // Writes this rank's failure record for its launcher (comm/failure_record.h): the error's
  // kind and text, and the ranks that went silent (`not_arrived`: group ranks that never arrived
  // at the collective).
  void tell_launcher(const std::exception_ptr& error, const std::string& context,
                     const std::vector<int>& not_arrived) const;
  void build_hierarchy();
  void share_links(int groups);
  // DTRAIN_COST_FILE unusable on any rank: every rank measures instead (link_calibration.cc).
  void agree_on_costs();  // `groups` (this one among them) run at once over its links
  void fail_internal_groups(std::exception_ptr error);
  std::shared_ptr<Executor> executor_;
  CollectiveContext::Buffer scratch_;         // used by the running collective only
  CollectiveContext::Buffer workspace_;       // likewise
  CollectiveContext::Persistent persistent_;  // likewise
  // Its collectives, for post-mortems and the flight recorder (made by start()).
  std::shared_ptr<CallHistory> history_;
  uint16_t flight_group_ = 0;  // this group's name in the flight recorder
  // Records a point-to-point call (null for a group the recorder leaves out) and returns the
  // ticket its work ends.
  uint64_t record_p2p(FlightCall::Kind kind, size_t bytes, int peer, int tag, const void* caller,
                      const Deadline& deadline);
  std::unique_ptr<Watchdog> watchdog_;

  std::mutex mu_;  // guards next_seq_, children_, failure_, failed_seq_, mismatch_, mismatch_seq_
  uint32_t next_seq_ = 0;
  uint32_t children_ = 0;
  std::exception_ptr failure_;       // set once a collective failed: the group is unusable
  std::atomic<bool> failed_{false};  // failure_ is set (read without mu_ by failure_from)
  uint32_t failed_seq_ = 0;          // ... and which one (0: all of them, as after an abort)
  // failure_ if it concerns collective #seq: earlier ones go on (see Pair::fail_group).
  std::exception_ptr failure_from(uint32_t seq);
  // The first mismatch a peer's message showed (Device::GroupHandlers::mismatch): the next
  // collective fails with it at once, should the one it concerns be over already.
  std::exception_ptr mismatch_;
  uint32_t mismatch_seq_ = 0;
};

}  // namespace dtrain::comm
