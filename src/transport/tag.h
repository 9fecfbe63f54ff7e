// Message tags: 64 bits that keep apart the traffic of different groups and operations sharing
// one connection.   [ 8 bits space | 24 bits group id | 32 bits tag or sequence number ]
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace dtrain::transport {

enum class TagSpace : uint8_t { kPointToPoint = 1, kCollective = 2 };

inline uint64_t make_tag(TagSpace space, uint32_t group_id, uint32_t value) {
  return (uint64_t{static_cast<uint8_t>(space)} << 56) | (uint64_t{group_id & 0xffffffu} << 32) |
         value;
}

inline uint32_t group_of(uint64_t tag) { return static_cast<uint32_t>(tag >> 32) & 0xffffffu; }

// The collective a tag names (its sequence number), or 0 for any other tag.
inline uint32_t collective_seq_of(uint64_t tag) {
  return static_cast<TagSpace>(tag >> 56) == TagSpace::kCollective ? static_cast<uint32_t>(tag) : 0;
}

inline std::string describe_tag(uint64_t tag) {
  auto space = static_cast<TagSpace>(tag >> 56);
  auto value = static_cast<uint32_t>(tag);
  if (space == TagSpace::kPointToPoint) return fmt::format("tag {}", static_cast<int32_t>(value));
  if (space == TagSpace::kCollective) return fmt::format("collective #{}", value);
  return fmt::format("tag 0x{:x}", tag);
}

}  // namespace dtrain::transport
