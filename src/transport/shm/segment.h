// Segment: the shared memory two ranks on one host talk through, an RAII mapping.
//
// The lower rank creates it under a name derived from the job, the group and the two ranks
// (removing a stale one left by a crashed run of the same job first), the higher rank opens it,
// and as soon as both have it mapped the name is unlinked: from then on nothing is left in
// /dev/shm, whatever happens to either process.
//
// Layout: a header page (magic, version, the two pids), then one ring per direction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/shm/ring.h"

namespace dtrain::transport::shm {

inline constexpr uint64_t kSegmentMagic = 0x4d48535f4e525444;  // "DTRN_SHM"
inline constexpr size_t kRingBytes = size_t{1} << 20;  // per direction; pages mapped up front

struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  int32_t creator_pid;
  int32_t opener_pid;
  uint64_t creator_probe;  // address of a known value in each process, to test whether the
  uint64_t opener_probe;   // other side may read its memory (cross-memory attach)
  uint32_t creator_reads_opener;  // 1 when process_vm_readv from the other side works
  uint32_t opener_reads_creator;
};

class Segment {
 public:
  Segment() = default;
  // Creates `name` (unlinking a stale one first); throws PeerFailureError on failure.
  static Segment create(const std::string& name);
  // Opens an existing `name` created by the peer and checks its header.
  static Segment open(const std::string& name);
  Segment(Segment&& o) noexcept;
  Segment& operator=(Segment&& o) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  // Removes the name (the mapping stays).
  void unlink();
  // Tests whether this process may read the peer's memory (same user, ptrace scope) and records
  // it in the header; `creator` says which side this is. DTRAIN_CMA=0 records "no".
  void probe_peer(bool creator);
  // Whether the peer may read this process's memory, as it recorded.
  bool peer_reads_us(bool creator) {
    return (creator ? header().opener_reads_creator : header().creator_reads_opener) != 0;
  }
  bool valid() const { return base_ != nullptr; }
  SegmentHeader& header() { return *static_cast<SegmentHeader*>(base_); }
  // The ring from the creator (lower rank) to the opener, and back.
  Ring ring(bool from_creator);

  static size_t size() { return 4096 + 2 * (sizeof(RingControl) + kRingBytes); }

 private:
  void* base_ = nullptr;
  std::string name_;
  bool linked_ = false;
};

// "/dtrain-<job>-<group>-<lo>-<hi>" with unsafe characters replaced.
std::string segment_name(const std::string& job, const std::string& group, int lo, int hi);

}  // namespace dtrain::transport::shm
