// A fast checksum of bytes in memory, to tell whether ranks hold the same copy of a state
// (share_tensors: survivors of a failure skip the transfer when theirs agree). Never stored:
// files keep durable.h's CRC-32. Where the processor has an instruction for CRC-32C it runs
// three of them at once, each over its own share of every run of 24 bytes (several times zlib's
// speed; a change to any byte changes its stream's CRC, as a CRC of the whole would), else one
// zlib CRC-32. The algorithm is part of the digest: ranks on different kinds of processor
// compare unequal, which costs a transfer, never a wrong answer.
//
//   dtrain::MemoryDigest d;
//   for (const auto& t : tensors) d.add(t.data_ptr(), t.nbytes());
//   std::array<int64_t, 2> mine = d.value();   // all-gather it, compare
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace dtrain {

class MemoryDigest {
 public:
  void add(const void* data, size_t size);
  // The streams' CRCs and the algorithm, packed for an all-gather of int64s.
  std::array<int64_t, 2> value() const;

 private:
  std::array<uint32_t, 3> streams_{};
  bool hardware_ = true;  // decided at the first add()
  bool started_ = false;
};

}  // namespace dtrain
