// The digest that tells whether ranks hold the same bytes: the same bytes give the same digest,
// and a change of any one byte (in each stream and in the tail), of two bytes in different
// streams at the same place, or of the length gives another.
#include "common/memory_digest.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <set>
#include <vector>

namespace dtrain {
namespace {

std::vector<uint8_t> bytes(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + 7);
  return v;
}

std::array<int64_t, 2> digest_of(const std::vector<uint8_t>& v, size_t n) {
  MemoryDigest d;
  d.add(v.data(), n);
  return d.value();
}

TEST(MemoryDigest, TheSameBytesGiveTheSameDigestAndAnyByteChangedAnother) {
  for (size_t n : {0, 1, 7, 8, 23, 24, 25, 100, 1000, 4099}) {
    const auto v = bytes(n);
    const auto digest = digest_of(v, n);
    EXPECT_EQ(digest_of(bytes(n), n), digest) << n;
    std::set<std::array<int64_t, 2>> seen = {digest};
    for (size_t i = 0; i < n; ++i) {
      auto w = v;
      w[i] ^= 0x10;
      EXPECT_TRUE(seen.insert(digest_of(w, n)).second)
          << "byte " << i << " of " << n << " changed, the digest did not";
      if (i + 8 < n) {  // the same change in the next stream too: no cancelling out
        w[i + 8] ^= 0x10;
        EXPECT_NE(digest_of(w, n), digest) << "bytes " << i << " and " << i + 8 << " of " << n;
      }
    }
    if (n > 0) {
      EXPECT_NE(digest_of(v, n - 1), digest) << n;
    }
  }
}

TEST(MemoryDigest, PiecesAddUpTheSameWayOnEveryRank) {
  const auto a = bytes(100), b = bytes(300);
  MemoryDigest one, two, b_alone;
  one.add(a.data(), a.size());
  one.add(b.data(), b.size());
  two.add(a.data(), a.size());
  two.add(b.data(), b.size());
  b_alone.add(b.data(), b.size());
  EXPECT_EQ(one.value(), two.value());
  EXPECT_NE(one.value(), b_alone.value());
}

}  // namespace
}  // namespace dtrain
