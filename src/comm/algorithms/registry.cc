// The list of collective algorithms. Each is defined in its own file (algorithm.h); this file
// only names them, the algorithms of one collective in order of preference (default first).
#include <array>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "comm/algorithms/algorithm.h"

namespace dtrain::comm::algo {

extern const Algorithm kAllreduceRing, kAllreduceHalvingDoubling, kAllreduceRecursiveDoubling,
    kAllreduceCentral, kAllreduceDirect, kAllreduceHierarchical, kBroadcastTree,
    kBroadcastScatterAllgather, kBroadcastHierarchical, kReduceTree, kReduceRing, kAllgatherRing,
    kAllgatherBruck, kAllgatherDirect, kAllgatherHierarchical, kAllgathervRing, kReduceScatterRing,
    kReduceScatterDirect, kGatherLinear, kScatterLinear, kAlltoallPairwise, kAlltoallvPairwise,
    kBarrierDissemination;

namespace {

constexpr std::array kAll = {
    &kAllreduceRing,
    &kAllreduceHalvingDoubling,
    &kAllreduceRecursiveDoubling,
    &kAllreduceCentral,
    &kAllreduceDirect,
    &kAllreduceHierarchical,
    &kBroadcastTree,
    &kBroadcastScatterAllgather,
    &kBroadcastHierarchical,
    &kReduceTree,
    &kReduceRing,
    &kAllgatherRing,
    &kAllgatherBruck,
    &kAllgatherDirect,
    &kAllgatherHierarchical,
    &kAllgathervRing,
    &kReduceScatterRing,
    &kReduceScatterDirect,
    &kGatherLinear,
    &kScatterLinear,
    &kAlltoallPairwise,
    &kAlltoallvPairwise,
    &kBarrierDissemination,
};

const std::map<CollectiveKind, std::vector<const Algorithm*>>& by_kind() {
  static const auto* kinds = [] {
    auto* m = new std::map<CollectiveKind, std::vector<const Algorithm*>>;
    for (const Algorithm* a : kAll) (*m)[a->kind].push_back(a);
    return m;
  }();
  return *kinds;
}

}  // namespace

std::span<const Algorithm* const> registry() { return kAll; }

std::span<const Algorithm* const> algorithms_of(CollectiveKind kind) {
  const auto& m = by_kind();
  auto it = m.find(kind);
  if (it == m.end()) return {};
  return it->second;
}

const Algorithm* find(CollectiveKind kind, std::string_view name) {
  for (const Algorithm* a : algorithms_of(kind))
    if (a->name == name) return a;
  return nullptr;
}

bool can_run(const Algorithm& a, const Topology& t, int n) {
  switch (a.needs) {
    case Needs::kNothing:
      return true;
    case Needs::kReadAll:
      return t.can_read_all || n <= 1;
    case Needs::kParts:
      return t.hosts >= 2 && t.per_host >= 2;
    case Needs::kUniformParts:
      return t.hosts >= 2 && t.per_host >= 2 && t.uniform;
  }
  return true;
}

std::string unusable(const Algorithm& a, const Topology& t, int n) {
  if (can_run(a, t, n)) return {};
  if (a.needs == Needs::kReadAll)
    return fmt::format(
        "{} '{}' needs every rank of the group on this host, on shared memory, "
        "with cross-memory attach permitted (same user, ptrace scope 0 or 1, "
        "DTRAIN_CMA=1)",
        to_string(a.kind), a.name);
  return fmt::format(
      "{} '{}' needs the group spread over two or more hosts (or racks) with two "
      "or more of its ranks on some{}",
      to_string(a.kind), a.name,
      a.needs == Needs::kUniformParts ? ", the same number on each" : "");
}

std::string markdown_table() {
  std::string out =
      "| collective | name | file | cost | chosen by the model when |\n|---|---|---|---|---|\n";
  for (const Algorithm* a : kAll)
    out += fmt::format("| {} | `{}` | `{}` | {} | {} |\n", to_string(a->kind), a->name, a->file,
                       a->formula, a->chosen);
  return out;
}

}  // namespace dtrain::comm::algo
