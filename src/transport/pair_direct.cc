// The direct path of a pair (pair.h, try_send_now/try_recv_now): a collective's small steps
// over shared memory with no request, queue or event-loop state. A posted request costs an
// allocation, two locks and a wait loop's bookkeeping: about as long as the message's own trip
// between cores (docs/performance.md, "What a small collective costs before it moves a byte").
// Both functions take the pair only when nothing else is under way on it, and give up (having
// changed nothing) at anything unusual: the general path then handles it, errors included.
#include "transport/pair.h"

namespace dtrain::transport {

bool Pair::try_send_now(uint64_t tag, const void* data, size_t size, uint64_t aux) {
  shm::RingStream* rs = ring();
  if (rs == nullptr || size > kDirectMaxBytes) return false;
  std::unique_lock lock(mu_, std::try_to_lock);
  // Earlier sends still queued go first; a failed group's sends fail (refuse_locked).
  if (!lock.owns_lock() || broken_ || !send_queue_.empty() || !failed_groups_.empty()) return false;
  FrameHeader header;
  header.tag = tag;
  header.size = size;
  header.aux = aux;
  if (!rs->write_frame(header, data, size)) return false;
  ++send_seq_;
  bytes_moved_ += sizeof(header) + size;
  return true;
}

bool Pair::try_recv_now(uint64_t tag, void* data, size_t size, uint64_t expected_aux) {
  shm::RingStream* rs = ring();
  if (rs == nullptr) return false;
  std::unique_lock lock(mu_, std::try_to_lock);
  // Receives posted earlier match first; a frame half read, or one that arrived early and was
  // kept (unexpected_), is the general path's.
  if (!lock.owns_lock() || broken_ || rx_state_ != RxState::kHeader || rx_header_done_ != 0 ||
      !posted_.empty() || !unexpected_.empty() || !failed_groups_.empty())
    return false;
  if (rs->take_boxed(tag, data, size, expected_aux)) {
    ++recv_seq_;
    bytes_moved_ += sizeof(FrameHeader) + size;
    return true;
  }
  FrameHeader header;
  if (!rs->peek(&header, sizeof(header))) return false;
  // Anything but this receive's plain frame, whole (a mismatch included: the general path
  // explains it).
  if (header.magic != kFrameMagic || header.flags != 0 || header.tag != tag ||
      header.size != size || (expected_aux != 0 && header.aux != expected_aux) ||
      rs->readable() < sizeof(header) + size)
    return false;
  rs->read(reinterpret_cast<std::byte*>(&header), sizeof(header));
  if (size > 0) rs->read(static_cast<std::byte*>(data), size);
  ++recv_seq_;
  bytes_moved_ += sizeof(header) + size;
  return true;
}

}  // namespace dtrain::transport
