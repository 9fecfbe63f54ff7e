// RingStream: a pair's bytes through the two rings of a shared segment (shm/ring.h), and small
// frames through the mailboxes beside them (shm/mailbox.h), with the pair's TCP connection left
// to carry doorbells and to tell of the peer's death.
//
// How the other side learns of new data or room: it asks, in the ring's flags, for nothing (it
// polls), for a doorbell (a byte on the socket, which wakes its event loop) or for its bell (a
// futex word in the segment a thread of it sleeps on). Writing and reading here answer what the
// other side asked for, with no system call when it asked for nothing.
//
// It offers the same calls as the TCP stream (tcp/socket_stream.h), so that the pair never asks
// which stream it has, and holds what only shared memory can do: cross-memory attach (shm/cma.h),
// for large messages in one copy and for collectives that read their peers' memory.
//
// Every member is guarded by the owning pair's mutex.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transport/frame.h"
#include "transport/shm/segment.h"

namespace dtrain::transport::shm {

class RingStream {
 public:
  // `fd`: the pair's socket (the pair owns it); `creator`: this side created the segment.
  RingStream(int fd, Segment segment, bool creator);

  // Non-blocking, errno semantics (EAGAIN when nothing can move now), as a socket's.
  ssize_t write(const iovec* iov, size_t count);
  ssize_t read(std::byte* out, size_t n);

  // All of iov or nothing: false (nothing written) when the ring has no room for the whole.
  bool write_whole(const iovec* iov, size_t count);
  // A whole frame, through the mailbox when it fits and may go there (shm/mailbox.h), else the
  // ring; false (nothing written) when there is no room for it. Only at a frame's boundary:
  // nothing of an earlier frame may be left to write.
  bool write_frame(const FrameHeader& header, const void* payload, size_t size);
  // The next n bytes, copied out and left where they are; false if fewer are here.
  bool peek(void* out, size_t n);
  size_t readable();
  // The next frame, when it waits whole in the mailbox and is this receive's plain frame (its
  // tag, payload size and aux, unless 0): its payload copied to `out`, the frame consumed. False,
  // with nothing read, otherwise: the caller reads the stream as usual. At a frame's boundary.
  bool take_boxed(uint64_t tag, void* out, size_t size, uint64_t aux);

  // The socket only carries doorbells (and tells of the peer's death): the event loop watches
  // it for data, and it stays in the loop while a thread polls the pair.
  static constexpr bool kSocketCarriesData = false;
  // The event loop is handling a socket event: reads look at the socket on every empty ring
  // (the event may be a doorbell or a close) instead of every so often, and the peer is asked
  // for no doorbells meanwhile.
  void begin_event() {
    draining_ = true;
    quiet();
  }
  void end_event() { draining_ = false; }
  // Asks the peer to say when data comes (`want_data`, always while a thread sleeps on the
  // bell) or room frees up (`want_room`): with the bell while a thread sleeps on it, with a
  // doorbell otherwise. True when nothing is to be
  // done meanwhile; false when data or room is here already, which the caller must move (after
  // quiet(), since moving it answers the flags) before asking again.
  bool ask_to_be_told(bool want_data, bool want_room);
  // Asks the peer for nothing but the bell a sleeping thread needs (a waiter polls).
  void quiet();
  // A doorbell for the peer's event loop.
  void ring_doorbell();

  // Threads asleep on this side's bell (they move the bytes themselves when it rings).
  void add_sleeper() { ++sleepers_; }
  void remove_sleeper() { --sleepers_; }
  std::atomic<uint32_t>* bell() { return &segment_.bell(creator_); }
  // Wakes the threads asleep on this side's bell: a request one waits for may have finished
  // on another thread.
  void wake_sleepers();

  // Whether a message of `bytes` goes in one copy: the peer copies it out of this process's
  // memory (cross-memory attach), told where by a descriptor in the ring. From kOneCopyMinBytes,
  // where the peer may read this process's memory; below it the ring's two copies, on both
  // cores at once and in cache, are faster (docs/performance.md, "The transport's settings").
  static constexpr size_t kOneCopyMinBytes = size_t{32} << 20;
  bool sends_in_one_copy(size_t bytes);
  // Cross-memory attach the other way: whether this process may read (and write) the peer's
  // memory, and the copies themselves (false with errno set when the kernel refuses or the peer
  // is gone). The peer's pid comes from the segment, not the wire. These three read only what
  // the segment's set-up wrote: they need no lock.
  bool we_read_peer();
  bool read_peer(std::byte* out, uint64_t address, size_t size);
  bool write_peer(uint64_t address, const std::byte* in, size_t size);

 private:
  // What the flags say while nobody wants a doorbell: the bell, if a thread sleeps on it.
  uint32_t idle_flags() const { return sleepers_ > 0 ? kWantBell : 0; }
  // Whether the next bytes to read are the mailbox's (its frame is here, or half read) rather
  // than the ring's.
  bool mailbox_next();
  // Tells the consumer of what was just written, as it asked; `full`: not all of it fit.
  void after_write(bool full);
  // Bumps and wakes the peer's bell (a thread of the peer sleeps on it).
  void ring_peer_bell();
  pid_t peer_pid();

  int fd_;
  Segment segment_;
  bool creator_;
  Ring in_, out_;
  Mailbox in_box_, out_box_;
  bool draining_ = false;
  uint32_t empty_polls_ = 0;  // empty ring reads since the socket was last asked
  int sleepers_ = 0;
  int one_copy_ = -1;  // -1 not yet asked, 0 the peer cannot read our memory, 1 it can
  // The producer's count when the doorbell for the ring filling up was last rung.
  uint64_t full_rung_at_ = ~uint64_t{0};
};

}  // namespace dtrain::transport::shm
