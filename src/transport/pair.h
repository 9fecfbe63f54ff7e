// Pair: the connection between this rank and one peer, and the sends and receives on it.
//
// What is the same whatever carries the bytes lives here: frames (frame.h), matching receives to
// incoming messages by tag (first posted first matched), keeping messages that arrive before
// their receive ("unexpected"), reducing a payload into its receive as it arrives, a peer's
// group-failed notices, cancellation, and poisoning (a broken connection fails every pending and
// future request once, with an error naming this rank, the peer, the operation and the bytes it
// had moved). The bytes themselves go through a stream: the TCP socket (tcp/socket_stream.h) or,
// with a peer on this host, the rings of a shared segment (shm/ring_stream.h), chosen when the
// pair is made and dispatched statically (a variant, no virtual call per frame).
//
// The pair's surface is what a collective or a point-to-point call uses; how a waiting thread
// (wait.h) and the event loop (loop.h) drive it is private to them. Waiting goes one way: wait.h
// uses the pair, never the reverse.
//
// Who moves the bytes: a thread waiting on a request moves them itself (wait.h: it busy-polls a
// short while, then sleeps on what the stream offers: the socket, or the futex bell in the
// segment), and the device's event loop (loop.h) moves them for pairs nobody waits on. While a
// thread spins on the pair the socket is left out of the loop, so the two never fight. A pair a
// waiter leaves idle is "parked" (out of the loop; on shared memory, asking the peer for no
// doorbells) until a thread waits on it again or one about to sleep hands it back to the loop;
// a request posted on it leaves it parked, since its poster usually waits on it next.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "common/completion.h"
#include "common/deadline.h"
#include "common/socket.h"
#include "dtrain/reduce_op.h"
#include "dtrain/tensor.h"
#include "transport/frame.h"
#include "transport/request.h"
#include "transport/shm/ring_stream.h"
#include "transport/shm/segment.h"
#include "transport/spare_buffers.h"
#include "transport/tag_queues.h"
#include "transport/tcp/socket_stream.h"

namespace dtrain::transport {

class Loop;

struct PairOptions {
  int self_rank = 0;
  int peer_rank = 0;
  std::string peer_address;            // "host:port" the peer listens on, for error messages
  std::string group_name;              // for error messages
  std::chrono::microseconds spin{50};  // busy-poll before sleeping
  bool oversubscribed = false;         // more ranks on this host than cores: poll with sched_yield
  bool same_host = false;              // the peer runs on this host (TCP goes over loopback)
  // Called (with this pair's lock held: it must not call back into pairs) when the peer reports
  // that a group failed on its side.
  std::function<void(uint64_t tag, int peer, std::string text)> on_group_failed;
  // Called (lock held, same rule) for every message that arrives before its receive is posted.
  std::function<void(uint64_t tag, uint64_t aux, int peer)> on_unexpected;
};

class Pair : public std::enable_shared_from_this<Pair> {
 public:
  // With a segment, messages travel through its rings and the socket only carries doorbells
  // (and notices the peer's death); without one, through the socket.
  Pair(std::shared_ptr<Loop> loop, net::Fd fd, const PairOptions& options,
       shm::Segment segment = {}, bool segment_creator = false);
  ~Pair();
  Pair(const Pair&) = delete;
  Pair& operator=(const Pair&) = delete;

  // Starts a send or receive; the buffer must stay valid until the request completes.
  std::shared_ptr<Request> isend(uint64_t tag, const void* data, size_t size, Deadline deadline,
                                 uint64_t aux = 0);
  // Tells the peer that the group of `tag` failed here, and why; fire and forget.
  void send_group_failed(uint64_t tag, std::string text);
  // Fails the requests of one group (by the group id of their tags) that have not started, and
  // every later one of that group; other groups on the pair go on. With `from_seq` > 0 (the
  // collective that failed), the group's collectives before it go on: the rank that failed
  // #from_seq had completed them, so what they wait for is on its way, and failing them would
  // blame the wrong call. Later collectives fail at their start in the group anyway.
  void fail_group(uint32_t group_id, uint32_t from_seq, std::exception_ptr error);
  std::shared_ptr<Request> irecv(uint64_t tag, void* data, size_t size, Deadline deadline,
                                 uint64_t expected_aux = 0);
  // A receive that reduces the payload into `data` as it arrives (data[i] = data[i] op
  // payload[i]), a piece at a time through a small buffer of the pair that stays in cache,
  // instead of landing it in a scratch buffer the size of the message for the caller to reduce
  // afterwards: one write and one read of the message's size to memory less (docs/performance.md,
  // "The transport's settings"). Nothing else may read or write `data` until the request
  // completes; `size` must be a multiple of the dtype's size.
  std::shared_ptr<Request> irecv_reduce(uint64_t tag, void* data, size_t size, Deadline deadline,
                                        uint64_t expected_aux, Request::Reduction reduce);

  // Small messages on shared memory without a request (pair_direct.cc), for a collective's
  // steps: when nothing else is under way on the pair, the frame goes into the ring now, or the
  // next frame in the ring is taken straight into `data` if it is this receive's (its tag,
  // size and aux). Otherwise they do nothing and return false, and the caller posts a request
  // (isend/irecv), which finds the stream as it was.
  static constexpr size_t kDirectMaxBytes = size_t{64} << 10;
  bool try_send_now(uint64_t tag, const void* data, size_t size, uint64_t aux);
  bool try_recv_now(uint64_t tag, void* data, size_t size, uint64_t expected_aux);

  // Fails the request with TimeoutError(why) if it has not finished; a request cut short in the
  // middle of a message closes the connection.
  void cancel(Request& request, const std::string& why);

  // A thread busy-polls this pair between begin_spin() and end_spin() (a collective, for its
  // whole run); the loop stays away. A pair with nothing posted is then "parked" (out of the
  // loop; on shared memory, asking for no doorbells): bytes of the next collective that a
  // faster peer sends early wait for the collective to read them, instead of waking the loop
  // thread (a context switch on a core the ranks need; docs/performance.md). unpark() hands it
  // back to the loop; a thread of the device about to sleep does so for every parked pair.
  void begin_spin();
  void end_spin();
  void unpark();
  std::chrono::microseconds spin() const { return options_.spin; }
  bool oversubscribed() const { return options_.oversubscribed; }
  // Moves whatever bytes the stream allows now, without blocking; true if any moved (false
  // also when another thread holds the pair).
  bool try_progress();
  // Whether a message with `tag` has arrived (in part at least) that no receive has claimed yet:
  // a receive posted for it now is matched with it (a receive from any source picks its pair
  // this way).
  bool has_unexpected(uint64_t tag);

  // Fails everything pending and future with `error` (AbortedError for abort()).
  void poison(std::exception_ptr error);
  // Like poison(), after telling the peer this rank is leaving on purpose.
  void close(std::exception_ptr error);
  // Why the pair is down: the peer closed or reset it (or died), a timed-out message left the
  // stream out of step (the peer may be alive but stopped), or this process closed it.
  enum class BrokenBy { kNothing, kPeer, kTimeout, kUs };
  BrokenBy broken_by();

  int peer_rank() const { return options_.peer_rank; }
  const std::string& peer_address() const { return options_.peer_address; }
  bool shared_memory() const { return ring() != nullptr; }
  // Shared memory with cross-memory attach: whether this rank may read and write the peer's
  // memory (the kernel grants both or neither), and the copies themselves (PeerFailureError,
  // naming the peer, when one fails).
  bool can_read_peer();
  void read_peer(std::byte* out, uint64_t address, size_t size);
  void write_peer(uint64_t address, const std::byte* in, size_t size);

 private:
  // How a waiting thread (wait.cc) drives the pair: it sleeps on the pair's requests while the
  // event loop moves the bytes (block_begin/end; shared memory then asks for doorbells), or on
  // what the stream offers to hear of the bytes itself: the socket (poll() it, with
  // wants_to_write() saying whether writability matters) or the bell a thread of this side
  // sleeps on (shared memory: between begin_bell_sleep() and end_bell_sleep(), with
  // look_before_sleep() after reading the bell's value and before each sleep).
  friend class Waiter;
  void block_begin();
  void block_end();
  struct SleepOn {
    int fd = -1;
    std::atomic<uint32_t>* bell = nullptr;
  };
  SleepOn sleep_on();
  void begin_bell_sleep();
  void end_bell_sleep();
  void look_before_sleep();
  bool wants_to_write();
  void unpark_idle_pairs();
  // Called by the event loop when the socket is ready.
  friend class Loop;
  void on_event(uint32_t events);

  struct Unexpected {
    uint64_t tag = 0;
    uint64_t aux = 0;
    // Uninitialised: every byte is written by the stream before it is read.
    std::unique_ptr<std::byte[]> bytes;
    size_t capacity = 0;
    size_t size = 0;
    size_t done = 0;
    bool complete() const { return done == size; }
    std::shared_ptr<Request> claimant;  // a receive posted while the message was still arriving
    bool control = false;               // a group-failed notice, not data
  };
  std::unique_ptr<Unexpected> new_unexpected_locked(uint64_t tag, uint64_t aux, size_t size);
  void recycle_locked(std::unique_ptr<Unexpected> u);

  enum class RxState : uint8_t { kHeader, kCmaDescriptor, kIntoRequest, kIntoUnexpected, kDiscard };

  std::unique_lock<std::mutex> lock_to_post();
  void progress_locked();
  void progress_send_locked();
  void progress_recv_locked();
  void on_frame_header_locked();
  // A kFrameCma frame's descriptor arrived: copy the payload out of the sender and answer.
  void on_cma_descriptor_locked();
  // After a copy to or from the peer's memory: counts its bytes, or throws naming the peer.
  void peer_copied(bool ok, size_t size, bool write);
  void queue_frame_locked(uint32_t flags, uint64_t tag);
  std::shared_ptr<Request> post_recv(std::shared_ptr<Request> r);
  void post_send_locked(const std::shared_ptr<Request>& r);
  void post_recv_locked(const std::shared_ptr<Request>& r);
  void finish_unexpected_locked(Unexpected& u);
  void deliver_unexpected(Unexpected& u, Request& r);
  // Puts `n` received payload bytes at the request's current position (r.done), reducing them
  // into it for irecv_reduce; a reducing receive takes whole elements only.
  void land_locked(Request& r, const std::byte* bytes, size_t n);
  std::byte* bounce_locked();
  // Fails r if a frame of `size` bytes with `aux` cannot go into it; true when it failed.
  bool reject_frame(Request& r, uint64_t size, uint64_t aux);
  void fail_locked(std::exception_ptr error);
  void fail_group_locked(uint32_t group_id, uint32_t from_seq, std::exception_ptr error);
  // Why a request with `tag` cannot run: its group failed (from before its collective).
  std::exception_ptr group_failure_locked(uint64_t tag) const;
  void rearm_locked();
  void rearm_after_post_locked();
  void cancel_locked(Request& r, const std::string& why);
  std::string peer_text() const;
  // The stream under the frames, dispatched without a virtual call: `f(stream)` on whichever
  // it is (both offer the same calls).
  template <class F>
  decltype(auto) on_stream(F&& f) {
    return std::visit(std::forward<F>(f), stream_);
  }
  ssize_t write_out(const iovec* iov, size_t count) {
    return on_stream([&](auto& s) { return s.write(iov, count); });
  }
  ssize_t read_in(std::byte* out, size_t n) {
    return on_stream([&](auto& s) { return s.read(out, n); });
  }
  bool socket_carries_data() const {
    return std::visit([](const auto& s) { return s.kSocketCarriesData; }, stream_);
  }
  // The shared-memory stream, for what only it has (one-copy frames, the peer's memory); null
  // on TCP.
  shm::RingStream* ring() { return std::get_if<shm::RingStream>(&stream_); }
  const shm::RingStream* ring() const { return std::get_if<shm::RingStream>(&stream_); }
  // A thread asleep on this side's bell may wait for requests that just finished here.
  void wake_sleepers_locked() {
    on_stream([](auto& s) { s.wake_sleepers(); });
  }
  std::exception_ptr connection_error(const std::string& what, int err) const;
  // The error a new request must fail with at once, or null.
  std::exception_ptr refuse_locked(const Request& r) const;

  std::shared_ptr<Loop> loop_;  // shared: requests may keep a pair alive past its device
  // The connection: it carries the bytes (TCP) or the doorbells (shared memory), and tells of
  // the peer's death either way.
  net::Fd fd_;
  const PairOptions options_;
  int blocked_ = 0;  // threads asleep on this pair's requests (guarded by mu_)

  std::mutex mu_;  // guards everything below, the stream's reads and writes included
  std::variant<tcp::SocketStream, shm::RingStream> stream_;
  std::exception_ptr broken_;
  struct GroupFailure {
    std::exception_ptr error;
    uint32_t from_seq = 0;  // collectives of the group before this one go on; 0: none
  };
  std::unordered_map<uint32_t, GroupFailure> failed_groups_;
  Clock::time_point broken_at_;
  uint64_t send_seq_ = 0;
  uint64_t recv_seq_ = 0;
  std::deque<std::shared_ptr<Request>> send_queue_;
  // The most bytes of messages without a posted receive one progress call reads.
  static constexpr size_t kUnexpectedBytesPerCall = size_t{1} << 20;
  TagQueues<std::shared_ptr<Request>> posted_;
  SpareBuffers spare_;  // before unexpected_, which gives back to it
  TagQueues<std::unique_ptr<Unexpected>> unexpected_;
  RxState rx_state_ = RxState::kHeader;
  FrameHeader rx_header_;
  size_t rx_header_done_ = 0;
  CmaDescriptor rx_cma_;
  size_t rx_cma_done_ = 0;
  std::deque<std::shared_ptr<Request>> cma_pending_;  // sends the peer is copying out
  std::shared_ptr<Request> rx_request_;
  // Reducing receives (irecv_reduce) read the stream into this and reduce from it; it holds
  // the bytes of an element split between two reads (rx_carry_ of them) in between.
  static constexpr size_t kBounceBytes = size_t{256} << 10;
  std::unique_ptr<std::byte[]> bounce_;
  size_t rx_carry_ = 0;
  Unexpected* rx_unexpected_ = nullptr;
  uint64_t rx_discard_left_ = 0;
  uint64_t bytes_moved_ = 0;  // both directions, ever: tells a spinning waiter it is progressing
  bool armed_ = false;        // registered with the loop (one-shot) and not yet fired
  uint32_t armed_events_ = 0;
  bool parked_ = false;  // idle after a spin: out of the loop (TCP), no doorbells (shm); end_spin

  std::atomic<int> spinners_{0};  // threads busy-polling this pair right now
  // Threads waiting for mu_ to post a send or receive: whoever holds it reading bytes nobody
  // asked for yet stops early for them (the receive being posted may be for those very bytes).
  std::atomic<int> posters_{0};
};

}  // namespace dtrain::transport
