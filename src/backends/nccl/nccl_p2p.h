// Sends and receives of an nccl group, over channels: one 2-rank NCCL communicator and stream
// per peer and direction, set up at the first operation that needs it.
//
// Why not the group's communicator: NCCL runs the operations of a communicator one after the
// other and a send waits for its receive, so ranks that post a receive before a send (a ring,
// an exchange) or a send before a collective the peer calls first would deadlock. A channel per
// direction carries sends one way only: operations to different peers, or in the two
// directions, never wait on each other, and the messages of one direction match in order,
// which is the ordering ProcessGroup promises for one tag. (NCCL has no tags: the group takes
// tag 0 only.)
//
// Why posting never blocks: a channel is up only when both ranks have joined it. The lower rank
// creates its NCCL id at its first operation on it and publishes it in the store; the higher
// rank picks it up when it finds it. Operations queue until then and are issued by progress(),
// which every call of the group and every wait on one of these Works runs. A queued operation
// that reaches its limit is simply dropped (nothing was sent; the group stays usable); one
// already issued can only be ended by aborting its channel, which is then unusable.
#pragma once

#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "backends/nccl/nccl_comm.h"
#include "comm/cuda/cuda_runtime.h"
#include "common/deadline.h"
#include "dtrain/store.h"
#include "dtrain/tensor.h"
#include "dtrain/work.h"

namespace dtrain::backends::nccl {

class P2pWork;

class NcclP2p : public std::enable_shared_from_this<NcclP2p> {
 public:
  // `store` is the group's own (prefixed); `group` names it in errors and NCCL's logs.
  NcclP2p(std::shared_ptr<Store> store, int rank, int device, std::string group);
  ~NcclP2p();

  // Posts a send of `tensor` to `peer` (or a receive from it); never waits for the peer.
  // `what` is "rank 0: send of 4096 bytes to rank 1 (tag 0) of group world (nccl)".
  std::shared_ptr<Work> post(bool send, const TensorView& tensor, int peer,
                             const Deadline& deadline, std::string what);
  // Sets up the channels whose peer has published its id or joined, and issues what waits on
  // them. Never blocks longer than an issue does.
  void progress();
  // Drops `work` if it is still queued (failing it with `error`); false when it was issued.
  bool cancel(const P2pWork* work, std::exception_ptr error);
  // Fails every queued operation and aborts every channel.
  void abort(std::exception_ptr reason);

 private:
  struct Channel {
    int peer = -1;
    bool outgoing = true;            // this rank sends on it
    std::string key;                 // store key of its NCCL id: "p2p/<from>-<to>"
    std::shared_ptr<NcclComm> comm;  // null until the id is known here
    bool ready = false;              // both ranks joined
    std::unique_ptr<cuda::Stream> stream;
    std::unique_ptr<cuda::Event> order;           // orders the stream after the tensor's producer
    std::deque<std::shared_ptr<P2pWork>> queued;  // posted, waiting for the channel, in order
    std::exception_ptr failure;                   // the channel is unusable since
    Clock::time_point next_look{};  // the higher rank looks for the id at most every 2 ms
  };
  Channel& channel_locked(int peer, bool outgoing);
  void advance_locked(Channel& ch);
  void issue_locked(Channel& ch, P2pWork& work);
  void fail_channel_locked(Channel& ch, std::exception_ptr error);
  // This rank's and the peer's rank in a channel's communicator (the lower rank is 0).
  int channel_rank(int peer) const { return rank_ < peer ? 0 : 1; }

  std::shared_ptr<Store> store_;
  int rank_;
  int device_;
  std::string group_;
  std::mutex mu_;  // guards channels_, events_ (taken before any P2pWork's own lock)
  std::map<std::pair<int, bool>, Channel> channels_;  // by (peer, outgoing)
  std::shared_ptr<cuda::EventPool> events_;           // each message's completion event
};

}  // namespace dtrain::backends::nccl
