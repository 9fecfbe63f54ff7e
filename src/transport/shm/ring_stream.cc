#include "transport/shm/ring_stream.h"

#include <linux/futex.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include "common/log.h"
#include "transport/shm/cma.h"

namespace dtrain::transport::shm {
namespace {

void futex_wake(std::atomic<uint32_t>& word) {
  // Shared between processes: not FUTEX_PRIVATE.
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
}

// The flags sit in a cache line the other side reads after every write or read of the ring:
// storing a value they already hold would take the line away from it for nothing.
void set(std::atomic<uint32_t>& flag, uint32_t value) {
  if (flag.load(std::memory_order_relaxed) != value) flag.store(value, std::memory_order_relaxed);
}

void bump(std::atomic<uint32_t>& bell) {
  bell.fetch_add(1, std::memory_order_release);
  futex_wake(bell);
}

}  // namespace

RingStream::RingStream(int fd, Segment segment, bool creator)
    : fd_(fd), segment_(std::move(segment)), creator_(creator) {
  in_ = segment_.ring(!creator_);
  out_ = segment_.ring(creator_);
  in_box_ = segment_.mailbox(!creator_);
  out_box_ = segment_.mailbox(creator_);
}

ssize_t RingStream::write(const iovec* iov, size_t count) {
  size_t wanted = 0;
  for (size_t i = 0; i < count; ++i) wanted += iov[i].iov_len;
  const size_t n = out_.write(iov, count);
  after_write(n < wanted);
  if (n == 0) {
    errno = EAGAIN;
    return -1;
  }
  return static_cast<ssize_t>(n);
}

void RingStream::after_write(bool full) {
  // The consumer's event loop must drain the ring when this side cannot finish without it (the
  // ring filled up); otherwise the bytes may wait in the ring until the consumer polls. A
  // sleeping consumer is always told.
  std::atomic_thread_fence(
      std::memory_order_seq_cst);  // pairs with ask_to_be_told's flag-then-check
  // One doorbell per filling-up, not one per retry: the ring is full at a new head only after
  // the consumer read and this side wrote again (keyed on our own head, which the consumer's
  // answer to the doorbell cannot move).
  const bool refilled = full && out_.produced() != full_rung_at_;
  const uint32_t consumer = out_.control().consumer_sleeping.load(std::memory_order_relaxed);
  if ((consumer & kWantDoorbell) || refilled) ring_doorbell();
  if (consumer & kWantBell) ring_peer_bell();
  if (refilled) full_rung_at_ = out_.produced();
}

bool RingStream::write_whole(const iovec* iov, size_t count) {
  size_t wanted = 0;
  for (size_t i = 0; i < count; ++i) wanted += iov[i].iov_len;
  if (!out_.has_room(wanted)) return false;
  return write(iov, count) == static_cast<ssize_t>(wanted);
}

bool RingStream::write_frame(const FrameHeader& header, const void* payload, size_t size) {
  // Only while the ring is read out: every frame in the mailbox is then older than anything the
  // consumer has not read of the ring, and it reads the two in order (mailbox_next).
  if (size <= kMailboxPayloadBytes && out_.drained() && out_box_.post(header, payload, size)) {
    after_write(false);
    return true;
  }
  const iovec iov[2] = {{const_cast<FrameHeader*>(&header), sizeof(header)},
                        {const_cast<void*>(payload), size}};
  return write_whole(iov, size > 0 ? 2 : 1);
}

ssize_t RingStream::read(std::byte* out, size_t n) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    const size_t got =
        mailbox_next() ? in_box_.copy_out(out, n, /*consume=*/true) : in_.read(out, n);
    if (got > 0) {
      std::atomic_thread_fence(std::memory_order_seq_cst);
      const uint32_t producer = in_.control().producer_waiting.load(std::memory_order_relaxed);
      if (producer & kWantDoorbell) ring_doorbell();
      if (producer & kWantBell) ring_peer_bell();
      return static_cast<ssize_t>(got);
    }
    // The ring is empty: the socket says whether the peer is still there (doorbells are
    // drained; a close or reset comes after everything it wrote into the ring). A polling
    // thread asks only every so often: a system call per poll would slow the poll down.
    if (!draining_ && (++empty_polls_ & 127) != 0) break;
    char bells[256];
    const ssize_t r = ::recv(fd_, bells, sizeof(bells), MSG_DONTWAIT);
    if (r <= 0) return r;
  }
  errno = EAGAIN;
  return -1;
}

bool RingStream::mailbox_next() {
  if (in_box_.ready()) return true;
  // Bytes of the ring seen and unread: the producer posts nothing to the mailbox until they
  // are read, and every frame posted before them was in sight when they were seen.
  if (in_.seen() > 0) return false;
  // Look at the ring, then at the mailbox once more: a frame posted between the first look at
  // the mailbox and this look at the ring is older than what the ring now shows.
  in_.look();
  return in_box_.ready();
}

bool RingStream::peek(void* out, size_t n) {
  if (!mailbox_next()) return in_.peek(static_cast<std::byte*>(out), n);
  if (in_box_.unread() < n) return false;
  in_box_.copy_out(static_cast<std::byte*>(out), n, /*consume=*/false);
  return true;
}

bool RingStream::take_boxed(uint64_t tag, void* out, size_t size, uint64_t aux) {
  // Unlike read(), no look at whether the producer waits: it waits only for room in the ring,
  // and a slot taken frees none.
  return mailbox_next() && in_box_.take(tag, out, size, aux);
}

size_t RingStream::readable() { return mailbox_next() ? in_box_.unread() : in_.seen(); }

bool RingStream::ask_to_be_told(bool want_data, bool want_room) {
  // A thread asleep on the bell moves this pair's bytes itself: it is the one to wake, and it
  // waits for data whatever the pair has posted.
  const uint32_t how = sleepers_ > 0 ? kWantBell : kWantDoorbell;
  want_data |= sleepers_ > 0;
  set(in_.control().consumer_sleeping, want_data ? how : 0);
  set(out_.control().producer_waiting, want_room ? how : 0);
  // Then look once more: data that came before the flag was seen would otherwise wait for the
  // next message.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return (!want_data || (!in_box_.ready() && in_.empty())) && (!want_room || out_.full());
}

void RingStream::quiet() {
  set(in_.control().consumer_sleeping, idle_flags());
  set(out_.control().producer_waiting, idle_flags());
}

void RingStream::ring_doorbell() {
  const char bell = 1;
  [[maybe_unused]] ssize_t n = ::send(fd_, &bell, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void RingStream::ring_peer_bell() { bump(segment_.bell(!creator_)); }

void RingStream::wake_sleepers() {
  if (sleepers_ > 0) bump(segment_.bell(creator_));
}

bool RingStream::we_read_peer() {
  auto& h = segment_.header();
  return (creator_ ? h.creator_reads_opener : h.opener_reads_creator) != 0;
}

pid_t RingStream::peer_pid() {
  auto& h = segment_.header();
  return creator_ ? h.opener_pid : h.creator_pid;
}

bool RingStream::sends_in_one_copy(size_t bytes) {
  if (bytes < kOneCopyMinBytes) return false;
  if (one_copy_ < 0) {
    one_copy_ = segment_.peer_reads_us(creator_) ? 1 : 0;
    DTRAIN_LOG_DEBUG("large messages to process {} go {}", peer_pid(),
                     one_copy_ ? "in one copy (cross-memory attach)"
                               : "through the ring (cross-memory attach not permitted)");
  }
  return one_copy_ == 1;
}

bool RingStream::read_peer(std::byte* out, uint64_t address, size_t size) {
  return cma_copy(peer_pid(), out, address, size, CmaDirection::kRead);
}

bool RingStream::write_peer(uint64_t address, const std::byte* in, size_t size) {
  // process_vm_writev does not write through `local`; the iovec merely lacks a const member.
  return cma_copy(peer_pid(), const_cast<std::byte*>(in), address, size, CmaDirection::kWrite);
}

}  // namespace dtrain::transport::shm
