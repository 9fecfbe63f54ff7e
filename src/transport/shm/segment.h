// Segment: the shared memory two ranks on one host talk through, an RAII mapping.
//
// The lower rank creates it under a name made of the job, the group, the two ranks, its pid and
// a random number, and sends the name to the higher rank over their TCP connection, which opens
// it; as soon as both have it mapped the name is unlinked: from then on nothing is left in
// /dev/shm, whatever happens to either process. The unique name keeps two jobs that share a job
// id (the default "dtrain") apart. Until the unlink the creator holds a lock on the segment;
// segments of the same job, group and ranks that nobody holds (their creator died in between)
// are removed when the next one is created.
//
// Layout: a header page (magic, version, the two pids, the bells, the mailboxes), then one ring
// per direction.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/socket.h"
#include "transport/shm/mailbox.h"
#include "transport/shm/ring.h"

namespace dtrain::transport::shm {

inline constexpr uint64_t kSegmentMagic = 0x4d48535f4e525444;  // "DTRN_SHM"
inline constexpr uint32_t kSegmentVersion = 3;
inline constexpr size_t kRingBytes = size_t{1} << 20;  // per direction; pages mapped up front

struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  int32_t creator_pid;
  int32_t opener_pid;
  uint64_t creator_probe;         // address of a known value in each process, to test whether the
  uint64_t opener_probe;          // other side may read its memory (cross-memory attach)
  uint32_t creator_reads_opener;  // 1 when process_vm_readv from the other side works
  uint32_t opener_reads_creator;
  // A futex word per side (creator, opener): a thread of that side sleeps on it, and the other
  // side bumps and wakes it when it writes data or frees room the sleeper waits for.
  struct alignas(64) Bell {
    std::atomic<uint32_t> seq{0};
  };
  Bell bells[2];
  // Small frames beside the rings (shm/mailbox.h): from the creator, and back.
  MailboxLines mailboxes[2];
};
static_assert(sizeof(SegmentHeader) <= 4096);

class Segment {
 public:
  Segment() = default;
  // Creates "<prefix>-<pid>-<random>" (removing stale "<prefix>-*" ones first); throws
  // PeerFailureError on failure. name() says what it is called.
  static Segment create(const std::string& prefix);
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
  // The futex word this side sleeps on, and the peer's.
  std::atomic<uint32_t>& bell(bool creator) { return header().bells[creator ? 0 : 1].seq; }
  const std::string& name() const { return name_; }
  SegmentHeader& header() { return *static_cast<SegmentHeader*>(base_); }
  // The ring from the creator (lower rank) to the opener, and back.
  Ring ring(bool from_creator);
  // The mailbox beside each ring.
  Mailbox mailbox(bool from_creator) { return Mailbox(&header().mailboxes[from_creator ? 0 : 1]); }

  static size_t size() { return 4096 + 2 * (sizeof(RingControl) + kRingBytes); }

 private:
  void* base_ = nullptr;
  std::string name_;
  bool linked_ = false;
  net::Fd lock_;  // creator: the open segment, locked, while the name exists
};

// "/dtrain-<job>-<group>-<lo>-<hi>" with unsafe characters replaced: the prefix of the
// segment's name.
std::string segment_name(const std::string& job, const std::string& group, int lo, int hi);

}  // namespace dtrain::transport::shm
