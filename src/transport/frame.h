// The frame every message between two ranks starts with, on either stream (socket or ring).
// The magic lets a receiver notice a corrupt or foreign stream at once instead of reading
// garbage as sizes.
#pragma once

#include <cstdint>

#include "common/byte_order.h"

namespace dtrain::transport {

inline constexpr uint32_t kFrameMagic = 0x4d525444;  // "DTRM"
// Refuse frames claiming more than this (a corrupt stream, not a real tensor).
inline constexpr uint64_t kMaxFrameBytes = uint64_t{1} << 40;

// flags
inline constexpr uint32_t kFrameGoodbye = 1;  // the sender is closing its group on purpose
// The payload is a UTF-8 explanation: the group of the frame's tag failed on the sender.
inline constexpr uint32_t kFrameGroupFailed = 2;
// Shared memory, large messages: instead of the payload the stream carries where it lies in the
// sender's memory (CmaDescriptor); the receiver copies it in one step (process_vm_readv) and
// answers with a kFrameCmaDone frame, which completes the send.
inline constexpr uint32_t kFrameCma = 4;
inline constexpr uint32_t kFrameCmaDone = 8;

// On the wire as they are: little-endian fields (common/byte_order.h), no padding.
struct CmaDescriptor {
  Le<uint64_t> address = 0;  // in the sender, whose pid the segment holds (not the wire: cma.h)
};

struct FrameHeader {
  Le<uint32_t> magic = kFrameMagic;
  Le<uint32_t> flags = 0;
  Le<uint64_t> tag = 0;   // what the message is for: see tag.h
  Le<uint64_t> size = 0;  // payload bytes that follow
  Le<uint64_t> aux = 0;   // free for the layer above (collective fingerprints)
};
static_assert(sizeof(FrameHeader) == 32);

}  // namespace dtrain::transport
