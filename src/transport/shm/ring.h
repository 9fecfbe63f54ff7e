// A single-producer single-consumer byte ring in shared memory: the stream between two ranks
// on one host. The producer advances `head`, the consumer `tail`; both are byte counts that
// only grow, so the ring never confuses full with empty. The two flags tell the other side
// how to wake this one when it writes data (consumer_sleeping) or frees room (producer_waiting):
// kWantDoorbell, a byte on the pair's socket for the event loop; kWantBell, a futex wake of
// this side's bell for a thread asleep on it; 0, not at all (this side polls).
#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace dtrain::transport::shm {

inline constexpr uint32_t kWantDoorbell = 1;
inline constexpr uint32_t kWantBell = 2;

struct alignas(64) RingControl {
  std::atomic<uint64_t> head{0};  // bytes ever written (producer)
  char pad0[56];
  std::atomic<uint64_t> tail{0};  // bytes ever read (consumer)
  char pad1[56];
  std::atomic<uint32_t> consumer_sleeping{0};  // the consumer waits for data: kWant* bits
  std::atomic<uint32_t> producer_waiting{0};   // the producer waits for room: kWant* bits
  char pad2[56];
};
static_assert(sizeof(RingControl) == 192);

class Ring {
 public:
  Ring() = default;
  Ring(RingControl* control, std::byte* data, size_t capacity)
      : c_(control), data_(data), capacity_(capacity) {}

  // Copies as much of iov as fits; returns the bytes written (0 when full).
  size_t write(const iovec* iov, size_t count) {
    size_t wanted = 0;
    for (size_t i = 0; i < count; ++i) wanted += iov[i].iov_len;
    const uint64_t head = c_->head.load(std::memory_order_relaxed);
    // The consumer's count as last seen: at least this much room is free. Reading the live one
    // takes the cache line from the consumer (and it must take it back to store the next
    // count), so it is read only when the room last seen is too small.
    size_t room = room_at(head);
    if (room < wanted) {
      seen_tail_ = c_->tail.load(std::memory_order_acquire);
      room = room_at(head);
    }
    size_t written = 0;
    for (size_t i = 0; i < count && room > 0; ++i) {
      size_t n = std::min(room, iov[i].iov_len);
      copy_in(head + written, static_cast<const std::byte*>(iov[i].iov_base), n);
      written += n;
      room -= n;
    }
    if (written > 0) c_->head.store(head + written, std::memory_order_release);
    return written;
  }

  // The consumer's look at the producer's count: what read and peek may take. They look again
  // by themselves only while bytes seen are still unread (the producer's mailbox stays shut
  // meanwhile, shm/mailbox.h); at an empty ring the caller looks, then at the mailbox.
  void look() { seen_head_ = c_->head.load(std::memory_order_acquire); }
  // Bytes seen at the last look and not yet read.
  size_t seen() const {
    return std::min(static_cast<size_t>(seen_head_ - c_->tail.load(std::memory_order_relaxed)),
                    capacity_);
  }

  // Copies up to n bytes out; returns the bytes read (0 when none were seen).
  size_t read(std::byte* out, size_t n) {
    const uint64_t tail = c_->tail.load(std::memory_order_relaxed);
    // Likewise the producer's count: a frame's payload, written with its header, is here
    // already when the header was.
    if (seen_head_ != tail && seen_head_ - tail < n) look();
    n = std::min({n, static_cast<size_t>(seen_head_ - tail), capacity_});
    if (n == 0) return 0;
    copy_out(tail, out, n);
    c_->tail.store(tail + n, std::memory_order_release);
    return n;
  }

  // Whether n bytes fit now (the producer's view).
  bool has_room(size_t n) {
    const uint64_t head = c_->head.load(std::memory_order_relaxed);
    if (room_at(head) < n) seen_tail_ = c_->tail.load(std::memory_order_acquire);
    return room_at(head) >= n;
  }
  // Whether the consumer has read every byte written (the producer's view; its count is read
  // only when the one last seen falls short).
  bool drained() {
    const uint64_t head = c_->head.load(std::memory_order_relaxed);
    if (seen_tail_ != head) seen_tail_ = c_->tail.load(std::memory_order_acquire);
    return seen_tail_ == head;
  }
  // Copies the next n bytes out without consuming them; false (nothing copied) if fewer are
  // here.
  bool peek(std::byte* out, size_t n) {
    const uint64_t tail = c_->tail.load(std::memory_order_relaxed);
    if (seen_head_ != tail && seen_head_ - tail < n) look();
    if (std::min(static_cast<size_t>(seen_head_ - tail), capacity_) < n) return false;
    copy_out(tail, out, n);
    return true;
  }

  // Bytes the consumer has ever read, and the producer ever written.
  uint64_t consumed() const { return c_->tail.load(std::memory_order_acquire); }
  uint64_t produced() const { return c_->head.load(std::memory_order_acquire); }
  bool empty() const {
    return c_->head.load(std::memory_order_acquire) == c_->tail.load(std::memory_order_acquire);
  }
  bool full() const {
    return c_->head.load(std::memory_order_acquire) - c_->tail.load(std::memory_order_acquire) ==
           capacity_;
  }
  RingControl& control() { return *c_; }

 private:
  void copy_in(uint64_t pos, const std::byte* src, size_t n) {
    const size_t at = static_cast<size_t>(pos % capacity_);
    const size_t first = std::min(n, capacity_ - at);
    std::memcpy(data_ + at, src, first);
    if (n > first) std::memcpy(data_, src + first, n - first);
  }
  void copy_out(uint64_t pos, std::byte* out, size_t n) const {
    const size_t at = static_cast<size_t>(pos % capacity_);
    const size_t first = std::min(n, capacity_ - at);
    std::memcpy(out, data_ + at, first);
    if (n > first) std::memcpy(out + first, data_, n - first);
  }

  // Room for the producer at `head` by the consumer's count last seen; none if the counters
  // the other process keeps were scribbled over (a write never goes outside the ring).
  size_t room_at(uint64_t head) const {
    const uint64_t used = head - seen_tail_;
    return used > capacity_ ? 0 : capacity_ - static_cast<size_t>(used);
  }

  RingControl* c_ = nullptr;
  std::byte* data_ = nullptr;
  size_t capacity_ = 0;
  // This process's last look at the other side's counter (each side uses a ring as producer
  // or as consumer, never both): the counters only grow, so a stale one errs on the safe side.
  uint64_t seen_tail_ = 0;  // producer
  uint64_t seen_head_ = 0;  // consumer
};

}  // namespace dtrain::transport::shm
