// Mailbox: a few cache-line slots per direction beside a pair's ring, each holding one small
// frame whole, its number written last. A frame through the ring costs the receiver two lines
// from the sender's core one after the other (the ring's write count, then the bytes) and the
// sender two lines to take back; a slot is one line each way, which is what a small
// collective's latency is made of (docs/performance.md, "Small frames in one cache line").
//
// The sender posts to the mailbox only when the receiver has read every byte of the ring and
// no frame is half written, so a frame in the mailbox is older than anything in the ring that
// the receiver has not read. The receiver, at a frame's start with nothing of the ring in
// sight, looks at the ring's count and then at the mailbox: a frame posted before the bytes it
// saw in the ring is then in sight too (RingStream::mailbox_next). Looking at the mailbox only
// before the ring once read a ring frame sent after a mailbox frame that came in between.
//
// A slot is reused only after the receiver has said (`taken`) that it is done with it, and
// holds its frame's number, so a stale slot from the last lap is never read as new.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "transport/frame.h"

namespace dtrain::transport::shm {

inline constexpr size_t kMailboxSlots = 4;
inline constexpr size_t kMailboxPayloadBytes = 32;

struct alignas(64) MailboxSlot {
  std::atomic<uint64_t> number{0};  // the frame's number from 1; stored after the rest
  uint64_t tag = 0;
  uint64_t aux = 0;
  uint32_t flags = 0;
  uint32_t size = 0;
  std::byte payload[kMailboxPayloadBytes];
};
static_assert(sizeof(MailboxSlot) == 64);

// One direction's slots, in the segment's header page.
struct MailboxLines {
  struct alignas(64) Taken {
    std::atomic<uint64_t> count{0};  // frames the receiver has taken (receiver)
  };
  Taken taken;
  MailboxSlot slots[kMailboxSlots];
};

// One side's view of one direction (each side posts into one and takes from the other). Not
// thread-safe: guarded by the owning pair's mutex, as the ring is.
class Mailbox {
 public:
  Mailbox() = default;
  explicit Mailbox(MailboxLines* lines) : lines_(lines) {}

  // Sender: posts a frame of at most kMailboxPayloadBytes; false (nothing posted) when every
  // slot is still the receiver's. The caller sees to the ring being read out first.
  bool post(const FrameHeader& header, const void* payload, size_t size) {
    if (size > kMailboxPayloadBytes || !slot_free()) return false;
    MailboxSlot& s = lines_->slots[posted_ % kMailboxSlots];
    s.tag = header.tag;
    s.aux = header.aux;
    s.flags = header.flags;
    s.size = static_cast<uint32_t>(size);
    if (size > 0) std::memcpy(s.payload, payload, size);
    s.number.store(++posted_, std::memory_order_release);
    return true;
  }
  // Receiver: whether the next frame is here; its bytes are `frame_bytes()` long, read in
  // pieces by copy_out and released by the read that reaches its end.
  bool ready() const {
    return lines_->slots[taken_ % kMailboxSlots].number.load(std::memory_order_acquire) ==
           taken_ + 1;
  }
  // Receiver, with ready(): the frame's bytes not yet read, as the ring would hold them.
  size_t unread() const { return frame_bytes() - offset_; }
  // Receiver, with ready(): copies up to n of the unread bytes; `consume` moves past them and,
  // at the frame's end, gives the slot back.
  size_t copy_out(std::byte* out, size_t n, bool consume) {
    const MailboxSlot& s = lines_->slots[taken_ % kMailboxSlots];
    FrameHeader header;
    header.tag = s.tag;
    header.aux = s.aux;
    header.flags = s.flags;
    header.size = s.size;
    // A slot claiming more than it holds was written by no dtrain peer: the frame fails the
    // receiver's magic check instead of being read past its end.
    if (s.size > kMailboxPayloadBytes) header.magic = 0;
    std::byte frame[sizeof(header) + kMailboxPayloadBytes];
    std::memcpy(frame, &header, sizeof(header));
    std::memcpy(frame + sizeof(header), s.payload, kMailboxPayloadBytes);
    const size_t total = frame_bytes();
    n = std::min(n, total - offset_);
    std::memcpy(out, frame + offset_, n);
    if (consume) {
      offset_ += n;
      if (offset_ == total) {
        offset_ = 0;
        lines_->taken.count.store(++taken_, std::memory_order_release);
      }
    }
    return n;
  }

  // Receiver, with ready(): takes the next frame whole when nothing of it has been read and it
  // carries `tag`, `size` bytes of payload and `aux` (unless 0), copying the payload to `out`;
  // false, with nothing taken, otherwise. One copy out of the slot, where copy_out builds the
  // frame's bytes as the ring would hold them.
  bool take(uint64_t tag, void* out, size_t size, uint64_t aux) {
    const MailboxSlot& s = lines_->slots[taken_ % kMailboxSlots];
    if (offset_ != 0 || size > kMailboxPayloadBytes || s.size != size || s.tag != tag ||
        s.flags != 0 || (aux != 0 && s.aux != aux))
      return false;
    if (size > 0) std::memcpy(out, s.payload, size);
    lines_->taken.count.store(++taken_, std::memory_order_release);
    return true;
  }

 private:
  bool slot_free() {
    if (posted_ - seen_taken_ < kMailboxSlots) return true;
    seen_taken_ = lines_->taken.count.load(std::memory_order_acquire);
    return posted_ - seen_taken_ < kMailboxSlots;
  }
  size_t frame_bytes() const {
    const uint32_t size = lines_->slots[taken_ % kMailboxSlots].size;
    return sizeof(FrameHeader) + std::min<size_t>(size, kMailboxPayloadBytes);
  }

  MailboxLines* lines_ = nullptr;
  uint64_t posted_ = 0;      // sender
  uint64_t seen_taken_ = 0;  // sender: the receiver's count as last read
  uint64_t taken_ = 0;       // receiver
  size_t offset_ = 0;        // receiver: bytes of the next frame already read
};

}  // namespace dtrain::transport::shm
