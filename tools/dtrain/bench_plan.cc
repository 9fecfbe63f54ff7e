// `dtrain bench`'s arguments checked into a Plan; the peers it accepts are bench_peers.h's table.
#include "tools/dtrain/bench_plan.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/env.h"
#include "dtrain/error.h"
#include "dtrain/process_group.h"
#include "tools/dtrain/bench_peers.h"

namespace dtrain::tools {
namespace {

using bench::Collective;

// "a,,b" -> {"a", "b"}: the comma-separated items of a flag, empty ones left out.
std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!item.empty()) items.push_back(item);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return items;
}

std::vector<Collective> parse_collectives(const std::string& text) {
  if (text == "all") return bench::all_collectives();
  std::vector<Collective> collectives;
  for (const auto& item : split_list(text)) collectives.push_back(bench::parse_collective(item));
  return collectives;
}

// Each peer once, in the order given.
std::vector<std::string> parse_peers(const std::string& text) {
  std::vector<std::string> peers;
  for (const auto& item : split_list(text)) {
    if (!find_peer(item))
      throw InvalidArgumentError(
          fmt::format("dtrain bench: unknown peer '{}': use {}", item, peer_names(" or ")));
    if (std::find(peers.begin(), peers.end(), item) == peers.end()) peers.push_back(item);
  }
  return peers;
}

}  // namespace

Plan make_plan(const BenchArgs& a) {
  Plan p;
  p.straggle_ms = a.straggle_ms;
  if (a.straggle_ms < 0)
    throw InvalidArgumentError("dtrain bench: --straggle-ms cannot be negative");
  try {
    p.collectives = parse_collectives(a.collectives);
    p.sizes = bench::parse_sizes(a.sizes);
    p.dtype = bench::parse_elem_type(a.dtype);
    p.op = bench::parse_op(a.op);
  } catch (const std::invalid_argument& e) {
    throw InvalidArgumentError(fmt::format("dtrain bench: {}", e.what()));
  }
  if (p.collectives.empty())
    throw InvalidArgumentError(
        "dtrain bench: name a collective, e.g. dtrain bench allreduce --np 4");
  if (a.iters < 1 || a.warmup < 0)
    throw InvalidArgumentError(fmt::format(
        "dtrain bench: --iters {} --warmup {}: time at least one iteration, warm up zero or more",
        a.iters, a.warmup));
  if (a.rounds < 1)
    throw InvalidArgumentError(
        fmt::format("dtrain bench: --rounds {}: run at least one round", a.rounds));
  if (a.timeout_s <= 0 || a.deadline_s <= 0)
    throw InvalidArgumentError("dtrain bench: --timeout and --deadline must be positive seconds");
  env::seconds("dtrain bench: --timeout", a.timeout_s);  // finite, at most a year
  env::seconds("dtrain bench: --deadline", a.deadline_s);
  if (a.transport != "auto" && a.transport != "tcp" && a.transport != "shm")
    throw InvalidArgumentError(fmt::format(
        "dtrain bench: --transport {}: use tcp, shm or auto (shared memory between ranks of one "
        "host, TCP between hosts)",
        a.transport));
  p.peers = parse_peers(a.peers);
  for (const auto& w : split_list(a.wire)) {
    try {
      parse_wire(w);
    } catch (const InvalidArgumentError&) {
      throw InvalidArgumentError(fmt::format(
          "dtrain bench: --wire {}: use exact, int8, int4, bf16, fp16, or a list of them "
          "(exact,bf16,int8)",
          w));
    }
    p.wires.push_back(w);
  }
  if (p.wires.empty()) p.wires.push_back("exact");
  const bool rounded = std::any_of(p.wires.begin(), p.wires.end(),
                                   [](const std::string& w) { return w != "exact"; });
  if (rounded && (p.collectives.size() != 1 || p.collectives[0] != Collective::kAllreduce ||
                  p.dtype != bench::ElemType::kF32 || p.op != bench::Op::kSum))
    throw InvalidArgumentError(
        "dtrain bench: --wire int8, int4, bf16 and fp16 time all_reduce of f32 with op sum only: "
        "name "
        "allreduce alone, with --dtype f32 and --op sum");
  return p;
}

std::optional<comm::CollectiveKind> kind_of(Collective c) {
  switch (c) {
    case Collective::kAllreduce:
      return comm::CollectiveKind::kAllreduce;
    case Collective::kBroadcast:
      return comm::CollectiveKind::kBroadcast;
    case Collective::kReduce:
      return comm::CollectiveKind::kReduce;
    case Collective::kAllgather:
      return comm::CollectiveKind::kAllgather;
    case Collective::kGather:
      return comm::CollectiveKind::kGather;
    case Collective::kScatter:
      return comm::CollectiveKind::kScatter;
    case Collective::kReduceScatter:
      return comm::CollectiveKind::kReduceScatter;
    case Collective::kAlltoall:
      return comm::CollectiveKind::kAlltoall;
    case Collective::kBarrier:
      return comm::CollectiveKind::kBarrier;
    case Collective::kSendRecv:
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace dtrain::tools
