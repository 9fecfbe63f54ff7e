#include "comm/collective.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/check.h"
#include "dtrain/error.h"
#include "transport/wait.h"

namespace dtrain::comm {
namespace {

constexpr int kKindBits = 5, kDtypeBits = 4, kOpBits = 4, kRootBits = 13, kCountBits = 38;
constexpr int kCountShift = 0;
constexpr int kRootShift = kCountShift + kCountBits;
constexpr int kOpShift = kRootShift + kRootBits;
constexpr int kDtypeShift = kOpShift + kOpBits;
constexpr int kKindShift = kDtypeShift + kDtypeBits;
static_assert(kKindShift + kKindBits == 64);

constexpr uint64_t mask(int bits) { return (uint64_t{1} << bits) - 1; }

bool has_op(CollectiveKind k) {
  return k == CollectiveKind::kAllreduce || k == CollectiveKind::kReduce ||
         k == CollectiveKind::kReduceScatter || k == CollectiveKind::kAllreduceInt8 ||
         k == CollectiveKind::kAllreduceBf16 || k == CollectiveKind::kAllreduceFp16 ||
         k == CollectiveKind::kAllreduceInt4;
}
bool has_root(CollectiveKind k) {
  return k == CollectiveKind::kBroadcast || k == CollectiveKind::kReduce ||
         k == CollectiveKind::kGather || k == CollectiveKind::kScatter;
}

}  // namespace

Agreement agreement_of(CollectiveKind kind) {
  if (has_root(kind)) return Agreement::kBefore;
  if (kind == CollectiveKind::kAlltoallv) return Agreement::kAfter;
  return Agreement::kNone;
}

uint64_t digest_counts(std::span<const size_t> counts) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the counts' bytes
  for (size_t c : counts)
    for (int i = 0; i < 8; ++i) {
      h ^= (static_cast<uint64_t>(c) >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  return h & mask(kCountBits);
}

std::string_view to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kAllreduce:
      return "all_reduce";
    case CollectiveKind::kReduce:
      return "reduce";
    case CollectiveKind::kAllgather:
      return "all_gather";
    case CollectiveKind::kAllgatherv:
      return "all_gather_v";
    case CollectiveKind::kGather:
      return "gather";
    case CollectiveKind::kScatter:
      return "scatter";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAlltoall:
      return "all_to_all";
    case CollectiveKind::kAlltoallv:
      return "all_to_all_v";
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kAllreduceInt8:
      return "all_reduce_int8";
    case CollectiveKind::kAllreduceBf16:
      return "all_reduce_bf16";
    case CollectiveKind::kAllreduceFp16:
      return "all_reduce_fp16";
    case CollectiveKind::kAllreduceInt4:
      return "all_reduce_int4";
  }
  return "unknown collective";
}

uint64_t CollectiveCall::fingerprint() const {
  return (uint64_t{static_cast<uint8_t>(kind)} & mask(kKindBits)) << kKindShift |
         (uint64_t{static_cast<uint8_t>(dtype)} & mask(kDtypeBits)) << kDtypeShift |
         (uint64_t{static_cast<uint8_t>(op)} & mask(kOpBits)) << kOpShift |
         (static_cast<uint64_t>(root) & mask(kRootBits)) << kRootShift |
         (count & mask(kCountBits)) << kCountShift;
}

CollectiveCall CollectiveCall::from_fingerprint(uint64_t fp) {
  CollectiveCall c;
  c.kind = static_cast<CollectiveKind>((fp >> kKindShift) & mask(kKindBits));
  c.dtype = static_cast<DType>((fp >> kDtypeShift) & mask(kDtypeBits));
  c.op = static_cast<ReduceOp>((fp >> kOpShift) & mask(kOpBits));
  c.root = static_cast<int>((fp >> kRootShift) & mask(kRootBits));
  c.count = (fp >> kCountShift) & mask(kCountBits);
  return c;
}

uint64_t CollectiveCall::head() const {
  return static_cast<uint64_t>(kind) | static_cast<uint64_t>(dtype) << 8 |
         static_cast<uint64_t>(op) << 16 | uint64_t{static_cast<uint32_t>(root)} << 32;
}

CollectiveCall CollectiveCall::from_head(uint64_t head, uint64_t count) {
  CollectiveCall c;
  c.kind = static_cast<CollectiveKind>(head & 0xff);
  c.dtype = static_cast<DType>((head >> 8) & 0xff);
  c.op = static_cast<ReduceOp>((head >> 16) & 0xff);
  c.root = static_cast<int>(static_cast<uint32_t>(head >> 32));
  c.count = count;
  return c;
}

std::string CollectiveCall::describe() const {
  if (kind == CollectiveKind::kBarrier) return "barrier()";
  std::string s = fmt::format("{}({}", to_string(kind), to_string(dtype));
  if (kind == CollectiveKind::kAllgatherv)
    s += fmt::format(", counts {:010x}",
                     count);  // the digest of the list: equal lists, equal digests
  else if (kind != CollectiveKind::kAlltoallv)
    s += fmt::format(", {}", count);
  if (has_op(kind)) s += fmt::format(", {}", to_string(op));
  if (has_root(kind)) s += fmt::format(", root {}", root);
  return s + ")";
}

CollectiveContext::CollectiveContext(int rank, int size, std::span<transport::Pair* const> pairs,
                                     uint64_t tag, const CollectiveCall& call, Deadline deadline,
                                     std::string_view group_name, uint32_t seq)
    : rank_(rank),
      size_(size),
      pairs_(pairs),
      tag_(tag),
      call_(call),
      deadline_(deadline),
      group_name_(group_name),
      seq_(seq) {}

std::string mismatch_message(int rank, std::string_view where, int peer,
                             const CollectiveCall& theirs, std::string_view this_rank_did) {
  return fmt::format(
      "rank {}: {}: rank {} called {} while this rank {}; every rank of a group must call the "
      "same collectives in the same order with the same arguments",
      rank, where, peer, theirs.describe(), this_rank_did);
}

std::string CollectiveContext::where() const {
  return fmt::format("collective #{} of group {}", seq_, group_name_);
}

transport::Pair* CollectiveContext::pair(int peer) const {
  DTRAIN_CHECK(peer >= 0 && peer < size_ && peer != rank_ && pairs_[peer] != nullptr);
  return pairs_[peer];
}

void CollectiveContext::touch(transport::Pair* p) {
  if (std::find(active_.begin(), active_.end(), p) != active_.end()) return;
  // The collective's thread polls its pairs itself for the whole run (see Pair::begin_spin).
  p->begin_spin();
  active_.push_back(p);
}

CollectiveContext::~CollectiveContext() {
  for (auto* p : active_) p->end_spin();
}

CollectiveContext::RequestPtr CollectiveContext::send(int peer, const void* data, size_t bytes) {
  auto* p = pair(peer);
  touch(p);
  return p->isend(tag_, data, bytes, deadline_, call_.fingerprint());
}

CollectiveContext::RequestPtr CollectiveContext::recv(int peer, void* data, size_t bytes) {
  auto* p = pair(peer);
  touch(p);
  return p->irecv(tag_, data, bytes, deadline_, call_.fingerprint());
}

CollectiveContext::RequestPtr CollectiveContext::recv_reduce(int peer, void* data, size_t bytes) {
  auto* p = pair(peer);
  touch(p);
  return p->irecv_reduce(tag_, data, bytes, deadline_, call_.fingerprint(),
                         {call_.dtype, call_.op});
}

void CollectiveContext::wait(std::span<const RequestPtr> requests) {
  // On the stack for the usual handful: a small collective's steps allocate nothing here.
  transport::Request* few[8];
  std::vector<transport::Request*> many;
  std::span<transport::Request*> raw(few, requests.size());
  if (requests.size() > std::size(few)) {
    many.resize(requests.size());
    raw = many;
  }
  for (size_t i = 0; i < requests.size(); ++i) raw[i] = requests[i].get();
  try {
    transport::wait_requests(raw, active_, deadline_, /*spinning=*/true);
  } catch (const InvalidArgumentError&) {
    for (auto* r : raw) {
      if (r->received_aux == 0) continue;
      throw InvalidArgumentError(mismatch_message(rank_, where(), r->pair->peer_rank(),
                                                  CollectiveCall::from_fingerprint(r->received_aux),
                                                  "called " + call_.describe()));
    }
    throw;
  }
}

bool CollectiveContext::can_read_all() const {
  for (int p = 0; p < size_; ++p)
    if (p != rank_ && !pairs_[p]->can_read_peer()) return false;
  return true;
}

void CollectiveContext::send_recv(int to, const void* out, size_t out_bytes, int from, void* in,
                                  size_t in_bytes) {
  if (direct_send_recv(to, out, out_bytes, from, in, in_bytes)) return;
  RequestPtr rs[2] = {recv(from, in, in_bytes), send(to, out, out_bytes)};
  wait(rs);
}

bool CollectiveContext::direct_send_recv(int to, const void* out, size_t out_bytes, int from,
                                         void* in, size_t in_bytes) {
  using transport::Pair;
  if (out_bytes > Pair::kDirectMaxBytes || in_bytes > Pair::kDirectMaxBytes) return false;
  Pair* sender = pair(to);
  Pair* receiver = pair(from);
  if (!sender->shared_memory() || !receiver->shared_memory()) return false;
  if (!sender->try_send_now(tag_, out, out_bytes, call_.fingerprint())) return false;
  // The peer's frame is usually here already or on its way: look for it a little (once only
  // where ranks outnumber cores: the peer needs this core to send it), then post a receive and
  // wait as usual, which spins and sleeps with the deadline and notices a dead peer.
  const int polls = receiver->oversubscribed() ? 1 : kDirectPolls;
  for (int i = 0; i < polls; ++i) {
    if (receiver->try_recv_now(tag_, in, in_bytes, call_.fingerprint())) return true;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  wait(recv(from, in, in_bytes));
  return true;
}

}  // namespace dtrain::comm
