// What one collective call is, and the context its algorithm runs in.
//
// Every message of a collective carries the call's fingerprint (kind, dtype, op, root, count) in
// the frame's aux field, free of charge: a receiver whose own call differs fails at once with a
// message naming both calls instead of hanging or reducing garbage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/deadline.h"
#include "dtrain/reduce_op.h"
#include "dtrain/tensor.h"
#include "transport/pair.h"
#include "transport/shm/shared_page.h"

namespace dtrain::comm {

enum class CollectiveKind : uint8_t {
  kBroadcast = 1,
  kAllreduce,
  kReduce,
  kAllgather,
  kAllgatherv,
  kGather,
  kScatter,
  kReduceScatter,
  kAlltoall,
  kAlltoallv,
  kBarrier,
  kAllreduceInt8,  // all-reduce with Wire::kInt8 (quantized_allreduce.h)
  kAllreduceBf16,  // ... with Wire::kBf16
  kAllreduceFp16,  // ... with Wire::kFp16
  kAllreduceInt4,  // ... with Wire::kInt4
};
std::string_view to_string(CollectiveKind kind);

struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::kBarrier;
  DType dtype = DType::kU8;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  uint64_t count = 0;  // elements per rank as the collective defines it (0 for the v-forms)

  // 64 bits: kind 5 | dtype 4 | op 4 | root 13 | count 38 (values beyond a field are folded).
  uint64_t fingerprint() const;
  static CollectiveCall from_fingerprint(uint64_t fp);
  // Everything but the count in one word, exactly (the fingerprint folds): for records that keep
  // a call in atomic words, read by another thread (watchdog.h, call_history.h).
  uint64_t head() const;
  static CollectiveCall from_head(uint64_t head, uint64_t count);
  // "all_reduce(f32, 1024, sum)", "broadcast(f32, 4096, root 0)"
  std::string describe() const;
};

// Whether ranks must confirm they agree on the call before (or after) its data moves.
//
// The fingerprint check catches a disagreement when a message of one call meets a rank running
// another. Some disagreements send no such message in time. Ranks that disagree only on the root
// of broadcast or scatter each take themselves (or another rank) for the sender and return
// different data; with reduce or gather they each wait for a message nobody sends. alltoallv's
// split sizes are agreed pair by pair: the rank whose receive does not fit fails, while the
// others have already finished. So these collectives run a dissemination exchange of empty,
// fingerprinted messages (ceil(log2 n) rounds): no rank finishes it before every rank's call has
// been compared, directly or through a chain of ranks whose calls matched. Rooted collectives
// run it first (a rank that disagrees fails before it sends or waits for data); alltoallv runs it
// last (a rank joins it only once its own receives fitted). Its cost, ceil(log2 n) alpha, is
// measured in docs/performance.md.
enum class Agreement { kNone, kBefore, kAfter };
Agreement agreement_of(CollectiveKind kind);

// Folds a list of counts (allgatherv's, which every rank passes whole) into the fingerprint's
// count field, so that ranks passing different lists disagree like ranks passing other counts.
uint64_t digest_counts(std::span<const size_t> counts);

// The words for a call that differs between ranks, the same on every path that finds one (the
// fingerprint check of CollectiveContext::wait, the group's mismatch handler): "rank 0: collective
// #3 of group world: rank 1 called broadcast(f32, 8, root 0) while this rank called ...; every rank
// of a group must call ...". `where`: "collective #3 of group world"; `this_rank_did`: "called
// all_reduce(...)", or what the rank's history says of #3 ("has not called collective #3 yet").
std::string mismatch_message(int rank, std::string_view where, int peer,
                             const CollectiveCall& theirs, std::string_view this_rank_did);

// The group-local view an algorithm works with: ranks are group ranks, and messages are tagged
// with this collective's sequence number and fingerprinted with its call.
class CollectiveContext {
 public:
  // `pairs`, by group rank (null for self), and `group_name` outlive the context (the group
  // holds them; the name is read only to describe a failure).
  CollectiveContext(int rank, int size, std::span<transport::Pair* const> pairs, uint64_t tag,
                    const CollectiveCall& call, Deadline deadline, std::string_view group_name,
                    uint32_t seq);
  ~CollectiveContext();  // hands the pairs back to the event loop
  CollectiveContext(const CollectiveContext&) = delete;
  CollectiveContext& operator=(const CollectiveContext&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const CollectiveCall& call() const { return call_; }
  size_t element_size() const { return dtrain::element_size(call_.dtype); }
  const Deadline& deadline() const { return deadline_; }

  using RequestPtr = std::shared_ptr<transport::Request>;
  RequestPtr send(int peer, const void* data, size_t bytes);
  RequestPtr recv(int peer, void* data, size_t bytes);
  // Receives `bytes` and reduces them into `data` with the call's op as they arrive, with no
  // scratch buffer (Pair::irecv_reduce). The caller leaves `data` alone until it completes.
  RequestPtr recv_reduce(int peer, void* data, size_t bytes);
  // Waits for the requests, busy-polling every pair this collective has used so far.
  void wait(std::span<const RequestPtr> requests);
  void wait(const RequestPtr& r) { wait(std::span<const RequestPtr>(&r, 1)); }
  // Reads `bytes` at `address` in `peer`'s memory (cross-memory attach; see can_read_all()).
  void read_peer(int peer, std::byte* out, uint64_t address, size_t bytes) {
    pair(peer)->read_peer(out, address, bytes);
  }
  // Writes `bytes` from `in` at `address` in `peer`'s memory (the same permission as reading).
  void write_peer(int peer, uint64_t address, const std::byte* in, size_t bytes) {
    pair(peer)->write_peer(address, in, bytes);
  }
  // Messages to and from `peer` go through shared memory (not TCP).
  bool on_shared_memory(int peer) const { return pair(peer)->shared_memory(); }
  // Every peer is on this host, on shared memory, and readable with cross-memory attach.
  bool can_read_all() const;
  // Sends to `to` and receives from `from` at once (a ring or exchange step).
  void send_recv(int to, const void* out, size_t out_bytes, int from, void* in, size_t in_bytes);

  // Scratch memory for the algorithm, reused across calls of the group (uninitialised).
  std::byte* scratch(size_t bytes) { return scratch_->get(bytes); }
  // A second region, for the collective around the algorithm (e.g. reduce-scatter's copy of
  // its input), so the two never overlap.
  std::byte* workspace(size_t bytes) { return workspace_->get(bytes); }
  struct Buffer {
    std::unique_ptr<std::byte[]> data;
    size_t size = 0;
    std::byte* get(size_t bytes) {
      if (bytes > size) {
        data = std::make_unique_for_overwrite<std::byte[]>(bytes);
        size = bytes;
      }
      return data.get();
    }
  };
  void set_buffers(Buffer* scratch, Buffer* workspace) {
    scratch_ = scratch;
    workspace_ = workspace;
  }
  // What algorithms keep from one call of the group to the next (the running collective's
  // only): the work-claiming counter of `direct` (see allreduce_direct.cc).
  struct Persistent {
    int claims_state = 0;  // 0: not set up yet; 1: every rank has the page; -1: not used
    std::optional<transport::shm::SharedPage> claims_page;
    uint64_t claims_base = 0;  // the counter's value when the next call starts
  };
  Persistent& persistent() { return *persistent_; }
  void set_persistent(Persistent* p) { persistent_ = p; }

  // "collective #17 of group world"
  std::string where() const;

 private:
  transport::Pair* pair(int peer) const;
  void touch(transport::Pair* p);
  // send_recv's small steps over shared memory, without requests (Pair::try_send_now): false
  // when the send could not go that way (nothing was done).
  bool direct_send_recv(int to, const void* out, size_t out_bytes, int from, void* in,
                        size_t in_bytes);
  // How often it looks for the peer's frame before posting a receive: a few microseconds.
  static constexpr int kDirectPolls = 256;

  int rank_;
  int size_;
  std::span<transport::Pair* const> pairs_;  // by group rank; null for self
  uint64_t tag_;
  CollectiveCall call_;
  Deadline deadline_;
  std::string_view group_name_;
  uint32_t seq_;
  std::vector<transport::Pair*> active_;  // pairs used so far, progressed while waiting
  Buffer* scratch_ = nullptr;
  Buffer* workspace_ = nullptr;
  Persistent* persistent_ = nullptr;
};

}  // namespace dtrain::comm
