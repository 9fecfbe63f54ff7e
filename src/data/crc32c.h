// CRC-32C (Castagnoli), the checksum of TFRecord files, and TFRecord's masked form of it.
// Debian 12 packages no C++ CRC-32C library, and zlib's crc32 is the other polynomial; this one
// uses the CPU's crc32 instruction (SSE 4.2) where it has one, a table otherwise.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtrain::data {

// CRC-32C of `size` bytes at `data`, continuing from `crc` (0 to start).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// TFRecord's stored checksum: the CRC rotated right by 15 bits plus a constant, so that a CRC
// stored inside CRC'ed data does not weaken the outer check (tensorflow/core/lib/hash/crc32c.h).
inline uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace dtrain::data
