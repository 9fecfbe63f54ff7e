// A fast checksum of bytes in memory (what and why in memory_digest.h).
#include "common/memory_digest.h"

#include <cstring>

#include "common/durable.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace dtrain {

namespace {

constexpr int64_t kCrc32c = 1, kZlib = 2;  // the algorithm, in value()

#if defined(__x86_64__)
// Each 24 bytes: 8 to each stream (the instruction's latency is three times its throughput, so
// three independent streams keep it busy); the tail goes to the first.
__attribute__((target("sse4.2"))) void crc32c_streams(const uint8_t* p, size_t size,
                                                      std::array<uint32_t, 3>& s) {
  uint64_t a = s[0], b = s[1], c = s[2];
  size_t i = 0;
  for (; i + 24 <= size; i += 24) {
    uint64_t x, y, z;
    std::memcpy(&x, p + i, 8);
    std::memcpy(&y, p + i + 8, 8);
    std::memcpy(&z, p + i + 16, 8);
    a = _mm_crc32_u64(a, x);
    b = _mm_crc32_u64(b, y);
    c = _mm_crc32_u64(c, z);
  }
  for (; i < size; ++i) a = _mm_crc32_u8(static_cast<uint32_t>(a), p[i]);
  s = {static_cast<uint32_t>(a), static_cast<uint32_t>(b), static_cast<uint32_t>(c)};
}

bool has_crc32c() { return __builtin_cpu_supports("sse4.2"); }
#else
bool has_crc32c() { return false; }
#endif

}  // namespace

void MemoryDigest::add(const void* data, size_t size) {
  if (!started_) {
    hardware_ = has_crc32c();
    started_ = true;
  }
#if defined(__x86_64__)
  if (hardware_) {
    crc32c_streams(static_cast<const uint8_t*>(data), size, streams_);
    return;
  }
#endif
  streams_[0] = durable::crc32_of(data, size, streams_[0]);
}

std::array<int64_t, 2> MemoryDigest::value() const {
  const int64_t algorithm = !started_ || hardware_ ? kCrc32c : kZlib;
  return {static_cast<int64_t>(uint64_t{streams_[0]} | uint64_t{streams_[1]} << 32),
          static_cast<int64_t>(uint64_t{streams_[2]} | static_cast<uint64_t>(algorithm) << 32)};
}

}  // namespace dtrain
