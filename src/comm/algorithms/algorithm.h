// A collective algorithm as the rest of dtrain sees it: its name, the collective it computes,
// where it can run, what it costs and how to run it. Each algorithm's file defines its
// descriptor; registry.cc lists them. The cost model prices the candidates of a collective by
// their descriptors, the process group runs the chosen one through its descriptor, and the tests,
// `dtrain bench --algo all` and `dtrain algorithms` (docs/algorithms.md's table) go through the
// registry: a new algorithm is one file and one line of the list.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/collective.h"
#include "comm/cost_model.h"

namespace dtrain::comm::algo {

// What a flat algorithm's cost formula is given: the cost model fills it in for the group's
// links and shape (cost_model.cc). Seconds, bytes.
struct CostInput {
  double M = 0;       // bytes per rank (all-gather: one rank's block)
  double N = 1;       // ranks
  LinkCost link;      // the slowest link its messages cross; beta scaled by the flows sharing it
  double gamma = 0;   // seconds per byte reduced
  double reread = 0;  // extra passes over the buffer where it spills out of the cache (rings)
  // Copies a byte costs on its way through the transport, counted in beta: 2 on shared memory
  // (into a ring and out), 1 over sockets. The all-gather and reduce-scatter rings pay it where
  // the direct forms copy once; the all-reduce formulas still count 1 (docs/algorithms.md).
  double trip = 1;
  double chunks = 0;  // M in 256 KiB chunks (chunked algorithms pay a message for each)
  double p = 1;       // the largest power of two <= N
  double lp = 0;      // log2 p
  double log2n = 0;   // ceil(log2 N)
  double fold = 0;    // folding the ranks beyond p onto p and back (fold.h), 0 when N = p
};

// What one call hands its algorithm (byte layouts of this rank's buffers).
struct Invocation {
  CollectiveContext& ctx;
  TensorView out;  // the result: in place for all-reduce, broadcast and reduce
  TensorView in;   // what this rank contributes, where that is not `out`
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  const Hierarchy* hierarchy = nullptr;  // the group's split (the hierarchical forms)
  // Per rank, in bytes: where its block lies in `out` and in `in` (all-gather(-v), all-to-all).
  std::span<const size_t> out_offsets, out_sizes, in_offsets, in_sizes;
};

inline std::byte* bytes_of(const TensorView& t) { return static_cast<std::byte*>(t.data); }

// All-gather: this rank's block (`in`) to its place in `out`, unless it is there already.
inline void place_own_block(const Invocation& i) {
  const int r = i.ctx.rank();
  std::byte* to = bytes_of(i.out) + i.out_offsets[r];
  if (i.out_sizes[r] > 0 && to != i.in.data) std::memmove(to, i.in.data, i.out_sizes[r]);
}

// Every rank sends `*mine` to every other and receives theirs into theirs[p] (the direct
// algorithms' rounds: buffer addresses out, "done with your buffer" back). Null pointers: an
// empty message each way, a round that only synchronises.
template <typename T>
void all_exchange(CollectiveContext& ctx, const T* mine, T* theirs) {
  const int n = ctx.size(), r = ctx.rank();
  std::vector<CollectiveContext::RequestPtr> reqs;
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    reqs.push_back(ctx.recv(p, theirs ? theirs + p : nullptr, theirs ? sizeof(T) : 0));
    reqs.push_back(ctx.send(p, mine, mine ? sizeof(T) : 0));
  }
  ctx.wait(reqs);
}

// What the group must offer beyond its ranks.
enum class Needs {
  kNothing,
  kReadAll,       // every rank on this host, readable with cross-memory attach
  kParts,         // two or more hosts (or racks), with two or more ranks on some
  kUniformParts,  // ... and the same number on each
};

// How many of a host's ranks send across the network at once: every one, or one per host where
// the hosts hold consecutive ranks (a ring passes each host's boundary once per step).
enum class Flows { kEveryRank, kOnePerHost };

struct Algorithm {
  std::string_view name;
  CollectiveKind kind;
  std::string_view file;     // under src/comm/algorithms/
  std::string_view formula;  // its cost, as docs/algorithms.md prints it
  std::string_view chosen;   // when the model picks it, in words
  Needs needs = Needs::kNothing;
  Flows flows = Flows::kEveryRank;
  // It reduces chunks that stay in a core's cache, whatever the buffer's size (the direct forms):
  // `dtrain bench --bound` prices its reductions at the cached rate, its copies through memory.
  bool reduces_in_cache = false;
  // It divides an average's sum itself (ctx.call().op is AVG), each piece as it is final and in
  // cache; for the others the group divides the whole result afterwards, one more pass over it.
  bool averages = false;
  // Seconds of its messages (the cost model adds the call). Null for the hierarchical forms,
  // which the model prices from the collectives they run inside and across the parts.
  double (*cost)(const CostInput&) = nullptr;
  void (*run)(const Invocation&) = nullptr;
};

// Every algorithm; those of one collective in order of preference, its default first.
std::span<const Algorithm* const> registry();
// The algorithms of `kind`, in that order.
std::span<const Algorithm* const> algorithms_of(CollectiveKind kind);
// `name` of `kind`, or null.
const Algorithm* find(CollectiveKind kind, std::string_view name);
// Whether `a` can run on a group of `n` ranks shaped `t`; if not, why (else "").
bool can_run(const Algorithm& a, const Topology& t, int n);
std::string unusable(const Algorithm& a, const Topology& t, int n);
// docs/algorithms.md's table of the algorithms (`dtrain algorithms --markdown`).
std::string markdown_table();

}  // namespace dtrain::comm::algo
