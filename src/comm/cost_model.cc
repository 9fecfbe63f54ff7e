#include "comm/cost_model.h"

#include <bit>
#include <cmath>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/env.h"
#include "dtrain/error.h"

namespace dtrain::comm {
namespace {

double log2_ceil(int n) { return n <= 1 ? 0.0 : std::ceil(std::log2(static_cast<double>(n))); }

// DTRAIN_ALGO is "ring" (for every collective that has it) or "allreduce=ring,broadcast=tree".
std::string env_choice(CollectiveKind kind, const std::string& spec) {
  if (spec.empty()) return {};
  std::string key(to_string(kind));
  std::erase(key, '_');
  size_t pos = 0;
  std::string plain;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(pos, end - pos);
    auto eq = item.find('=');
    if (eq == std::string::npos) {
      plain = item;
    } else {
      std::string k = item.substr(0, eq);
      std::erase(k, '_');
      if (k == key) return item.substr(eq + 1);
    }
    pos = end + 1;
  }
  if (!plain.empty()) {
    for (auto c : CostModel::candidates(kind))
      if (c == plain) return plain;
  }
  return {};
}

}  // namespace

CostModel::CostModel(CostConstants constants)
    : k_(constants), algo_env_(env::get_string(env::kAlgo)) {}

CostConstants CostModel::load() {
  CostConstants k;
  if (auto path = env::raw(env::kCostFile)) {
    std::ifstream f(*path);
    if (!f)
      throw InvalidArgumentError(fmt::format("DTRAIN_COST_FILE names '{}', which cannot be read", *path));
    try {
      auto j = nlohmann::json::parse(f);
      if (j.contains("alpha_us")) k.alpha = j["alpha_us"].get<double>() * 1e-6;
      if (j.contains("beta_gbps")) k.beta = 1.0 / (j["beta_gbps"].get<double>() * 1e9);
      if (j.contains("gamma_gbps")) k.gamma = 1.0 / (j["gamma_gbps"].get<double>() * 1e9);
    } catch (const nlohmann::json::exception& e) {
      throw InvalidArgumentError(fmt::format(
          "DTRAIN_COST_FILE '{}' is not a JSON object of alpha_us, beta_gbps, gamma_gbps: {}",
          *path, e.what()));
    }
  }
  if (std::ifstream llc("/sys/devices/system/cpu/cpu0/cache/index3/size"); llc) {
    // "32768K"
    double size = 0;
    char unit = 'K';
    if (llc >> size >> unit && size > 0)
      k.cache_bytes = size * (unit == 'M' ? 1024.0 * 1024 : unit == 'G' ? 1024.0 * 1024 * 1024 : 1024);
  }
  if (env::raw(env::kCostAlphaUs)) k.alpha = env::get_double(env::kCostAlphaUs) * 1e-6;
  if (env::raw(env::kCostBetaGbps)) k.beta = 1.0 / (env::get_double(env::kCostBetaGbps) * 1e9);
  if (env::raw(env::kCostGammaGbps)) k.gamma = 1.0 / (env::get_double(env::kCostGammaGbps) * 1e9);
  return k;
}

std::span<const std::string_view> CostModel::candidates(CollectiveKind kind) {
  static constexpr std::string_view kAllreduce[] = {"ring", "halving_doubling",
                                                    "recursive_doubling", "central", "direct",
                                                    "hierarchical"};
  static constexpr std::string_view kBroadcast[] = {"tree", "scatter_allgather", "hierarchical"};
  static constexpr std::string_view kReduce[] = {"tree", "ring"};
  static constexpr std::string_view kAllgather[] = {"ring", "bruck", "hierarchical"};
  static constexpr std::string_view kRing[] = {"ring"};
  static constexpr std::string_view kLinear[] = {"linear"};
  static constexpr std::string_view kPairwise[] = {"pairwise"};
  static constexpr std::string_view kBarrier[] = {"dissemination"};
  switch (kind) {
    case CollectiveKind::kAllreduce: return kAllreduce;
    case CollectiveKind::kBroadcast: return kBroadcast;
    case CollectiveKind::kReduce: return kReduce;
    case CollectiveKind::kAllgather: return kAllgather;
    case CollectiveKind::kAllgatherv: return kRing;
    case CollectiveKind::kReduceScatter: return kRing;
    case CollectiveKind::kGather:
    case CollectiveKind::kScatter: return kLinear;
    case CollectiveKind::kAlltoall:
    case CollectiveKind::kAlltoallv: return kPairwise;
    case CollectiveKind::kBarrier: return kBarrier;
  }
  return kLinear;
}

double CostModel::cost(std::string_view a, CollectiveKind kind, size_t bytes, int n,
                       const Topology& topology) const {
  const double M = static_cast<double>(bytes), N = n;
  const double al = topology.local ? k_.alpha_local : k_.alpha;
  const double be = topology.local ? k_.beta_local : k_.beta;
  const double ga = k_.gamma;
  if (n <= 1) return 0.0;
  if (a == "direct") {
    if (kind != CollectiveKind::kAllreduce || !topology.can_read_all) return 1e30;
    // Two rounds of messages, each a full trip through the executor and both rings.
    return 4 * al + (N - 1) / N * M * (2 * be + ga);
  }
  // On shared memory, the ring-based algorithms copy every byte into a ring and out again:
  // nearly free while the ranks' buffers stay in cache (both copies run at once, on two
  // cores), three times the cost of one copy through memory beyond it. Each rank's working set
  // is about four times its buffer (the buffer, the scratch, and the bytes in both rings), and
  // ranks that share a core also share its cache. Measured crossovers (docs/performance.md):
  // 4 ranks on 2 cores between 512 KiB and 1 MiB, 2 ranks between 2 and 4 MiB.
  const bool spills =
      topology.local && 4 * N * M * topology.oversubscription >= k_.cache_bytes;
  const double reread = spills ? 2.0 : 0.0;
  if (a == "hierarchical") {
    if (topology.hosts < 2 || topology.per_host < 2) return 1e30;
    const double k = topology.per_host, h = topology.hosts;
    const double al_l = k_.alpha_local, be_l = k_.beta_local;
    if (kind == CollectiveKind::kBroadcast)
      return log2_ceil(static_cast<int>(h)) * (k_.alpha + M * k_.beta) +
             log2_ceil(static_cast<int>(k)) * (al_l + M * be_l);
    if (kind == CollectiveKind::kAllgather) {
      if (!topology.host_contiguous) return 1e30;
      return (k - 1) * (al_l + M * be_l) + (h - 1) * (k_.alpha + k * M * k_.beta) +
             log2_ceil(static_cast<int>(k)) * (al_l + N * M * be_l);
    }
    if (kind != CollectiveKind::kAllreduce) return 1e30;
    const double inside = (k - 1) * k_.alpha_local + (k - 1) / k * M * k_.beta_local;
    const double across = 2 * (h - 1) * k_.alpha + 2 * (h - 1) / h * (M / k) * k_.beta;
    return 2 * inside + across + ((k - 1) / k + (h - 1) / h / k) * M * ga;
  }
  // Chunked algorithms pay a message per 256 KiB chunk as well.
  const double chunks = M / (256.0 * 1024.0);
  const int p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
  const double lp = std::log2(static_cast<double>(p));
  const double fold = n == p ? 0.0 : 2 * al + 2 * M * be + M * ga;
  switch (kind) {
    case CollectiveKind::kAllreduce:
      if (a == "ring")
        return 2 * (N - 1) * al + 2 * (N - 1) / N * ((1 + reread) * M * be + chunks * al) +
               (N - 1) / N * M * ga;
      if (a == "halving_doubling")
        return 2 * lp * al + (1 + reread) * 2 * (p - 1.0) / p * M * be + (p - 1.0) / p * M * ga +
               fold;
      if (a == "recursive_doubling") return lp * (al + (1 + reread) * M * be + M * ga) + fold;
      if (a == "central") return 2 * (N - 1) * (al + M * be) + (N - 1) * M * ga;
      break;
    case CollectiveKind::kBroadcast:
      if (a == "tree") return log2_ceil(n) * (al + M * be);
      if (a == "scatter_allgather") return 2 * (N - 1) * al + 2 * (N - 1) / N * M * be;
      break;
    case CollectiveKind::kReduce:
      if (a == "tree") return log2_ceil(n) * (al + M * be + M * ga);
      if (a == "ring") return 2 * (N - 1) * al + 2 * (N - 1) / N * M * be + (N - 1) / N * M * ga;
      break;
    case CollectiveKind::kAllgather:
      // bytes = one rank's block
      if (a == "ring") return (N - 1) * (al + M * be);
      if (a == "bruck") return log2_ceil(n) * al + (N - 1) * M * be + N * M / 15e9;
      break;
    default:
      return (N - 1) * (al + M * be);
  }
  return 1e30;
}

std::string_view CostModel::pick(CollectiveKind kind, size_t bytes, int n,
                                 const Topology& topology) const {
  auto c = candidates(kind);
  std::string_view best = c[0];
  double best_cost = cost(best, kind, bytes, n, topology);
  for (auto a : c.subspan(1)) {
    double x = cost(a, kind, bytes, n, topology);
    if (x < best_cost) {
      best = a;
      best_cost = x;
    }
  }
  return best;
}

std::string_view CostModel::choose(CollectiveKind kind, std::string_view requested, size_t bytes,
                                   int n, const Topology& topology) const {
  auto c = candidates(kind);
  auto usable = [&](std::string_view a) {
    if (a == "hierarchical" && (topology.hosts < 2 || topology.per_host < 2 ||
                                (kind == CollectiveKind::kAllgather && !topology.host_contiguous)))
      throw InvalidArgumentError(fmt::format(
          "{} 'hierarchical' needs the group spread over two or more hosts with the same number "
          "(two or more) of its ranks on each{}",
          to_string(kind), kind == CollectiveKind::kAllgather ? ", holding consecutive ranks" : ""));
    if (a == "direct" && !topology.can_read_all && n > 1)
      throw InvalidArgumentError(
          "all_reduce 'direct' needs every rank of the group on this host, on shared memory, "
          "with cross-memory attach permitted (same user, ptrace scope 0 or 1, DTRAIN_CMA=1)");
    return a;
  };
  if (!requested.empty()) {
    for (auto a : c)
      if (a == requested) return usable(a);
    throw InvalidArgumentError(fmt::format("{} has no algorithm '{}': use one of {}",
                                           to_string(kind), requested, fmt::join(c, ", ")));
  }
  const std::string from_env = env_choice(kind, algo_env_);
  if (!from_env.empty()) {
    for (auto a : c)
      if (a == from_env) return usable(a);
    throw InvalidArgumentError(fmt::format("DTRAIN_ALGO asks {} to use '{}': use one of {}",
                                           to_string(kind), from_env, fmt::join(c, ", ")));
  }
  return pick(kind, bytes, n, topology);
}

}  // namespace dtrain::comm
