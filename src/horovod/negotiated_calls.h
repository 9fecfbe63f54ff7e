// NegotiatedCalls: Horovod's negotiation for the blocking collectives of its API (allreduce,
// allgather, broadcast, alltoall, barrier, and join's part in them), without the Coordinator's
// cycle: they run on the calling thread, in call order.
//
// Every rank's call is agreed before any byte of it moves: one allgather of a fixed-size Call
// (what, dtype, shape, op or root, name) on the group, then either the collective itself on every
// rank, or the same error on every rank that names each rank's call. Nothing was sent, so the
// group stays usable and the next call goes on, as after Horovod's negotiation refused one. (A
// collective whose ranks disagree breaks a process group: its messages no longer line up.)
//
// A rank that joined (join(): it has run out of data) answers every round until every rank has
// joined: the others' all-reduces of sum or average get its zeros (an average divides by every
// rank, as Horovod's), their other calls fail on them saying who has joined.
// Free of LibTorch: the caller builds a Call from its tensor and gives the collective as a body.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/collective.h"
#include "dtrain/process_group.h"

namespace dtrain {

struct Call {
  enum class Kind : int64_t {
    kAllreduce = 1,
    kAllgather,
    kBroadcast,
    kAlltoall,
    kBarrier,
    kJoin,
    kReducescatter
  };
  static constexpr size_t kMaxDims = 8;  // a 9th dimension on is folded into the 8th's hash

  Kind kind = Kind::kBarrier;
  int64_t dtype = -1;  // a DType code, -1 for none
  int64_t op_or_root = 0;
  int64_t ndim = 0;
  int64_t count = 1;  // elements
  std::array<int64_t, kMaxDims> dims{};
  uint64_t name = 0;     // a hash of the name the caller gave; 0 for an automatic one
  bool refused = false;  // the caller found its own arguments wrong: every rank's call fails
  // The name itself: this rank's whole, another's up to kLabelBytes (what its errors show; the
  // hash decides whether two calls match).
  std::string label;

  static Call of(Kind kind, DType dtype, const std::vector<int64_t>& shape, int64_t op_or_root,
                 const std::string& name);
  // The rows of dimension 0 (1 for a scalar).
  int64_t rows() const { return ndim == 0 ? 1 : dims[0]; }
  size_t numel() const { return static_cast<size_t>(count); }
  // "allgather of f32 [17, 17]", "broadcast of i64 [3] from rank 1", "join()".
  std::string describe() const;
  // What every rank's call must share, as one number: its kind, dtype, shape (after dimension 0
  // for allgather and alltoall), op or root.
  uint64_t signature() const;

  static constexpr size_t kLabelWords = 4;
  static constexpr size_t kLabelBytes = kLabelWords * 8 - 1;  // NUL-terminated
  static constexpr size_t kWords = 7 + kMaxDims + kLabelWords;
  std::array<int64_t, kWords> encode() const;
  static Call decode(const int64_t* words);
  // The call as the flight recorder describes a collective (comm/flight_recorder.h).
  comm::CollectiveCall flight_call() const;
};

// The collective a Call::Kind code stands for (0, the Coordinator's all-reduce, too).
comm::CollectiveKind collective_kind_of(int64_t kind);

struct NegotiatedCallsOptions {
  std::string name = "Horovod API";  // who makes the calls, as errors say it
  // How long a rank in join() waits for the others' next call: they may compute for long between
  // calls. A dead peer still fails the wait at once.
  std::chrono::milliseconds join_wait{std::chrono::hours(24 * 365)};
};

class NegotiatedCalls {
 public:
  // What every rank called, once they agree (a joined rank's call is join(); only an all-reduce
  // runs with ranks joined).
  struct Agreed {
    const std::vector<Call>& calls;
  };
  using Body = std::function<void(const Agreed&)>;

  // Not collective; the group must carry nothing else (the calls' collectives use its sequence).
  NegotiatedCalls(std::shared_ptr<ProcessGroup> group, NegotiatedCallsOptions options = {});

  // Blocking, on this thread (one call at a time). Throws InvalidArgumentError when the ranks'
  // calls differ (on every rank, the group still usable), or the collective's error.
  void run(const Call& call, const Body& body);
  // For a call whose arguments this rank refused: the others' calls fail too (saying so) rather
  // than wait for it. The caller then throws its own error.
  void refuse(Call call);
  // This rank has run out of data: answers the others' calls until every rank has joined.
  void join();

  const std::shared_ptr<ProcessGroup>& group() const { return group_; }

 private:
  void execute(const Call& call, const Body& body);
  std::vector<Call> exchange(const Call& mine, std::chrono::milliseconds timeout);
  // Empty when the non-joined ranks agree; else why not, the same text on every rank.
  std::string disagreement(const std::vector<Call>& calls, uint64_t round) const;
  // A joined rank's part in the others' all-reduce: zeros.
  void zeros_for(const Call& call);

  std::shared_ptr<ProcessGroup> group_;
  NegotiatedCallsOptions options_;
  uint16_t flight_group_ = 0;  // the flight recorder's name for options_.name
  uint64_t rounds_ = 0;        // agreement rounds so far

  std::mutex mutex_;  // one call at a time; guards rounds_
};

}  // namespace dtrain
