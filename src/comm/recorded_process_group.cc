#include "comm/recorded_process_group.h"

#include "common/thread_clock.h"
#include "dtrain/error.h"

namespace dtrain::comm {
namespace {

// A Work whose end the flight recorder hears of.
class RecordedWork final : public Work {
 public:
  RecordedWork(std::shared_ptr<Work> inner, uint64_t ticket)
      : inner_(std::move(inner)), ticket_(ticket) {
    if (inner_->is_completed()) end();  // a synchronous call: over already
  }
  ~RecordedWork() override { end(); }

  bool is_completed() override {
    if (!inner_->is_completed()) return false;
    end();
    return true;
  }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int source_rank() const override { return inner_->source_rank(); }

 protected:
  void wait_until_done(std::optional<std::chrono::milliseconds> timeout) override {
    try {
      inner_->wait(timeout);
    } catch (...) {
      end();
      FlightRecorder::global().dump_on_failure("a call of a group failed");
      throw;
    }
    end();
  }

 private:
  void end() {
    const uint64_t ticket = ticket_.exchange(0);
    if (ticket == 0) return;
    const bool done = inner_->is_completed();
    // The wrapped backend waits without our clock: read it for the call's end.
    thread_clock::now();
    FlightRecorder::global().ended(ticket, done && inner_->exception() == nullptr);
  }

  std::shared_ptr<Work> inner_;
  std::atomic<uint64_t> ticket_;
};

}  // namespace

RecordedProcessGroup::RecordedProcessGroup(std::shared_ptr<ProcessGroup> inner, bool world)
    : inner_(std::move(inner)) {
  auto& recorder = FlightRecorder::global();
  if (world) recorder.set_rank(inner_->rank(), inner_->size());
  flight_group_ = recorder.group_id(inner_->name());
}

template <typename Run>
std::shared_ptr<Work> RecordedProcessGroup::recorded(const FlightCall& call, Run run) {
  auto& recorder = FlightRecorder::global();
  const uint64_t ticket = recorder.record(call);
  recorder.started(ticket);
  std::shared_ptr<Work> work;
  try {
    work = run();
  } catch (...) {
    recorder.ended(ticket, false);
    throw;
  }
  return std::make_shared<RecordedWork>(std::move(work), ticket);
}

template <typename Run>
std::shared_ptr<Work> RecordedProcessGroup::collective(CollectiveCall call, const void* caller,
                                                       Run run) {
  return recorded({.kind = FlightCall::Kind::kCollective,
                   .group = flight_group_,
                   .seq = ++next_seq_,
                   .call = call,
                   .caller = caller},
                  std::move(run));
}

template <typename Run>
std::shared_ptr<Work> RecordedProcessGroup::p2p(FlightCall::Kind kind, size_t bytes, int peer,
                                                int tag, const void* caller, Run run) {
  FlightCall call{.kind = kind, .group = flight_group_, .peer = peer, .tag = tag, .caller = caller};
  call.call.count = bytes;
  return recorded(call, std::move(run));
}

std::shared_ptr<Work> RecordedProcessGroup::isend(const TensorView& t, int dst, int tag,
                                                  const SendOptions& o) {
  return p2p(FlightCall::Kind::kSend, t.nbytes(), dst, tag, __builtin_return_address(0),
             [&] { return inner_->isend(t, dst, tag, o); });
}

std::shared_ptr<Work> RecordedProcessGroup::irecv(const TensorView& t, int src, int tag,
                                                  const RecvOptions& o) {
  return p2p(FlightCall::Kind::kRecv, t.nbytes(), src, tag, __builtin_return_address(0),
             [&] { return inner_->irecv(t, src, tag, o); });
}

std::shared_ptr<Work> RecordedProcessGroup::irecv_any(const TensorView& t, int tag,
                                                      const RecvOptions& o) {
  return p2p(FlightCall::Kind::kRecvAny, t.nbytes(), -1, tag, __builtin_return_address(0),
             [&] { return inner_->irecv_any(t, tag, o); });
}

std::shared_ptr<Work> RecordedProcessGroup::broadcast(const TensorView& t,
                                                      const BroadcastOptions& o) {
  return collective({CollectiveKind::kBroadcast, t.dtype, ReduceOp::kSum, o.root, t.numel},
                    __builtin_return_address(0), [&] { return inner_->broadcast(t, o); });
}

std::shared_ptr<Work> RecordedProcessGroup::allreduce(const TensorView& t,
                                                      const AllreduceOptions& o) {
  return collective({CollectiveKind::kAllreduce, t.dtype, o.op, 0, t.numel},
                    __builtin_return_address(0), [&] { return inner_->allreduce(t, o); });
}

std::shared_ptr<Work> RecordedProcessGroup::reduce(const TensorView& t, const ReduceOptions& o) {
  return collective({CollectiveKind::kReduce, t.dtype, o.op, o.root, t.numel},
                    __builtin_return_address(0), [&] { return inner_->reduce(t, o); });
}

std::shared_ptr<Work> RecordedProcessGroup::allgather(const TensorView& out, const TensorView& in,
                                                      const AllgatherOptions& o) {
  return collective({CollectiveKind::kAllgather, in.dtype, ReduceOp::kSum, 0, in.numel},
                    __builtin_return_address(0), [&] { return inner_->allgather(out, in, o); });
}

std::shared_ptr<Work> RecordedProcessGroup::allgatherv(const TensorView& out, const TensorView& in,
                                                       const std::vector<size_t>& counts,
                                                       const AllgatherOptions& o) {
  return collective(
      {CollectiveKind::kAllgatherv, in.dtype, ReduceOp::kSum, 0, digest_counts(counts)},
      __builtin_return_address(0), [&] { return inner_->allgatherv(out, in, counts, o); });
}

std::shared_ptr<Work> RecordedProcessGroup::gather(const TensorView& out, const TensorView& in,
                                                   const GatherOptions& o) {
  return collective({CollectiveKind::kGather, in.dtype, ReduceOp::kSum, o.root, in.numel},
                    __builtin_return_address(0), [&] { return inner_->gather(out, in, o); });
}

std::shared_ptr<Work> RecordedProcessGroup::scatter(const TensorView& out, const TensorView& in,
                                                    const ScatterOptions& o) {
  return collective({CollectiveKind::kScatter, out.dtype, ReduceOp::kSum, o.root, out.numel},
                    __builtin_return_address(0), [&] { return inner_->scatter(out, in, o); });
}

std::shared_ptr<Work> RecordedProcessGroup::reduce_scatter(const TensorView& out,
                                                           const TensorView& in,
                                                           const ReduceScatterOptions& o) {
  return collective({CollectiveKind::kReduceScatter, out.dtype, o.op, 0, out.numel},
                    __builtin_return_address(0),
                    [&] { return inner_->reduce_scatter(out, in, o); });
}

std::shared_ptr<Work> RecordedProcessGroup::alltoall(const TensorView& out, const TensorView& in,
                                                     const AlltoallOptions& o) {
  return collective({CollectiveKind::kAlltoall, in.dtype, ReduceOp::kSum, 0, in.numel},
                    __builtin_return_address(0), [&] { return inner_->alltoall(out, in, o); });
}

std::shared_ptr<Work> RecordedProcessGroup::alltoallv(const TensorView& out,
                                                      const std::vector<size_t>& out_counts,
                                                      const TensorView& in,
                                                      const std::vector<size_t>& in_counts,
                                                      const AlltoallOptions& o) {
  return collective({CollectiveKind::kAlltoallv, in.dtype, ReduceOp::kSum, 0, 0},
                    __builtin_return_address(0),
                    [&] { return inner_->alltoallv(out, out_counts, in, in_counts, o); });
}

std::shared_ptr<Work> RecordedProcessGroup::barrier(const BarrierOptions& o) {
  return collective({CollectiveKind::kBarrier, DType::kU8, ReduceOp::kSum, 0, 0},
                    __builtin_return_address(0), [&] { return inner_->barrier(o); });
}

std::shared_ptr<ProcessGroup> RecordedProcessGroup::new_group(const std::vector<int>& ranks) {
  auto group = inner_->new_group(ranks);
  if (!group) return group;
  return std::make_shared<RecordedProcessGroup>(std::move(group), false);
}

}  // namespace dtrain::comm
