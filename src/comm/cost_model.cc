#include "comm/cost_model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "comm/algorithms/algorithm.h"
#include "common/check.h"
#include "common/env.h"
#include "dtrain/error.h"

namespace dtrain::comm {
namespace {

double log2_ceil(int n) { return n <= 1 ? 0.0 : std::ceil(std::log2(static_cast<double>(n))); }

// The cost of what cannot run: never the cheapest.
constexpr double kUnusable = 1e30;

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
  if (!plain.empty() && algo::find(kind, plain) != nullptr) return plain;
  return {};
}

}  // namespace

CostModel::CostModel(CostConstants constants)
    : k_(constants), algo_env_(env::get_string(env::kAlgo)) {}

namespace {

// A positive, finite number at `key` of `j` (GB/s or microseconds), or `fallback` when absent.
double positive(const nlohmann::json& j, const char* key, double fallback,
                const std::string& where) {
  if (!j.contains(key)) return fallback;
  const auto& v = j.at(key);
  if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
    throw InvalidArgumentError(
        fmt::format("{}: '{}' must be a positive number, not {}", where, key, v.dump()));
  return v.get<double>();
}

void check_keys(const nlohmann::json& j, std::initializer_list<std::string_view> known,
                const std::string& where) {
  if (!j.is_object())
    throw InvalidArgumentError(fmt::format("{} must be a JSON object, not {}", where, j.dump()));
  for (const auto& [key, _] : j.items())
    if (std::find(known.begin(), known.end(), key) == known.end())
      throw InvalidArgumentError(
          fmt::format("{}: unknown key '{}' (known: {})", where, key, fmt::join(known, ", ")));
}

}  // namespace

CostConstants CostModel::read_file(const std::string& path, CostConstants k) {
  std::ifstream f(path);
  if (!f) throw InvalidArgumentError(fmt::format("cost file '{}' cannot be read", path));
  std::stringstream text;
  text << f.rdbuf();
  return parse(text.str(), fmt::format("cost file '{}'", path), k);
}

CostConstants CostModel::parse(const std::string& text, const std::string& where, CostConstants k) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgumentError(fmt::format("{} is not JSON: {}", where, e.what()));
  }
  // Version 1 (dtrain bench --calibrate): {"version": 1, "gamma_gbps": G, "links": {"shm" |
  // "host" | "rack": {"alpha_us": A, "beta_gbps": B}}, "note": "..."}; the flat form of a single
  // link class, {"alpha_us": A, "beta_gbps": B, "gamma_gbps": G}, is read as the host link.
  check_keys(j,
             {"version", "gamma_gbps", "call_us", "machine_gbps", "machine_shm_gbps", "links",
              "note", "alpha_us", "beta_gbps"},
             where);
  if (j.contains("version") && j["version"] != 1)
    throw InvalidArgumentError(
        fmt::format("{}: version {} is not one this dtrain reads (1)", where, j["version"].dump()));
  k.alpha = positive(j, "alpha_us", k.alpha * 1e6, where) * 1e-6;
  k.beta = 1.0 / (positive(j, "beta_gbps", 1.0 / k.beta / 1e9, where) * 1e9);
  k.gamma = 1.0 / (positive(j, "gamma_gbps", 1.0 / k.gamma / 1e9, where) * 1e9);
  k.call = positive(j, "call_us", k.call * 1e6, where) * 1e-6;
  if (j.contains("machine_gbps"))
    k.beta_machine = 1.0 / (positive(j, "machine_gbps", 0, where) * 1e9);
  if (j.contains("machine_shm_gbps"))
    k.beta_machine_shm = 1.0 / (positive(j, "machine_shm_gbps", 0, where) * 1e9);
  if (j.contains("links")) {
    check_keys(j["links"], {"shm", "host", "rack"}, where + " links");
    for (const auto& [name, link] : j["links"].items()) {
      const std::string at = fmt::format("{} links.{}", where, name);
      check_keys(link, {"alpha_us", "beta_gbps"}, at);
      if (!link.contains("alpha_us") || !link.contains("beta_gbps"))
        throw InvalidArgumentError(fmt::format("{}: needs alpha_us and beta_gbps", at));
      const double alpha = positive(link, "alpha_us", 0, at) * 1e-6;
      const double beta = 1.0 / (positive(link, "beta_gbps", 0, at) * 1e9);
      if (name == "shm") k.alpha_local = alpha, k.beta_local = beta;
      if (name == "host") k.alpha = alpha, k.beta = beta;
      if (name == "rack") k.alpha_rack = alpha, k.beta_rack = beta;
    }
  }
  return k;
}

std::string CostModel::to_json(const CostConstants& k, const std::string& note) {
  auto link = [](double alpha, double beta) {
    return nlohmann::json{{"alpha_us", alpha * 1e6}, {"beta_gbps", 1.0 / beta / 1e9}};
  };
  nlohmann::json j{{"version", 1},
                   {"gamma_gbps", 1.0 / k.gamma / 1e9},
                   {"call_us", k.call * 1e6},
                   {"note", note}};
  if (k.beta_machine > 0) j["machine_gbps"] = 1.0 / k.beta_machine / 1e9;
  if (k.beta_machine_shm > 0) j["machine_shm_gbps"] = 1.0 / k.beta_machine_shm / 1e9;
  j["links"]["shm"] = link(k.alpha_local, k.beta_local);
  j["links"]["host"] = link(k.alpha, k.beta);
  if (k.alpha_rack > 0 && k.beta_rack > 0) j["links"]["rack"] = link(k.alpha_rack, k.beta_rack);
  return j.dump(2) + "\n";
}

LoadedConstants CostModel::load() {
  LoadedConstants loaded;
  CostConstants& k = loaded.constants;
  if (std::ifstream llc("/sys/devices/system/cpu/cpu0/cache/index3/size"); llc) {
    // "32768K"
    double size = 0;
    char unit = 'K';
    if (llc >> size >> unit && size > 0)
      k.cache_bytes = size * (unit == 'M'   ? 1024.0 * 1024
                              : unit == 'G' ? 1024.0 * 1024 * 1024
                                            : 1024);
  }
  // At most the share of this machine's CPUs: a virtual machine (or a container on a large
  // host) is shown the whole socket's last level, which the other tenants' cores fill too.
  // Server parts hold 2-4 MiB of it per core.
  constexpr double kCachePerCpu = 4.0 * 1024 * 1024;
  k.cache_bytes =
      std::min(k.cache_bytes, kCachePerCpu * std::max(1u, std::thread::hardware_concurrency()));
  if (auto path = env::raw(env::kCostFile)) {
    try {
      k = read_file(*path, k);
    } catch (const InvalidArgumentError& e) {
      loaded.problem = fmt::format("DTRAIN_COST_FILE: {}", e.what());
    }
  }
  if (env::raw(env::kCostAlphaUs)) k.alpha = env::get_double(env::kCostAlphaUs) * 1e-6;
  if (env::raw(env::kCostBetaGbps)) k.beta = 1.0 / (env::get_double(env::kCostBetaGbps) * 1e9);
  if (env::raw(env::kCostGammaGbps)) k.gamma = 1.0 / (env::get_double(env::kCostGammaGbps) * 1e9);
  return loaded;
}

Topology CostModel::cross_of(const Topology& t) {
  Topology c;
  c.level = Topology::Level::kRacks;
  c.host_contiguous = true;
  c.oversubscription = 1.0;
  c.one_machine = t.one_machine;
  if (t.level == Topology::Level::kHosts && t.racks > 1) {
    c.hosts = t.racks;
    c.per_host = t.hosts_per_rack;
    c.uniform = t.racks * t.hosts_per_rack == t.hosts;
    c.spans_racks = true;
  } else {
    c.hosts = 1;  // one part: nothing further to split
    c.per_host = t.hosts;
    c.spans_racks = t.spans_racks || t.level == Topology::Level::kRacks;
  }
  // Uniform parts: one cross group per local index, all at once over the same links.
  c.nic_sharers = t.nic_sharers * (t.uniform ? t.per_host : 1);
  return c;
}

double CostModel::hierarchical(CollectiveKind kind, double M, int n, const Topology& t) const {
  if (t.hosts < 2 || t.per_host < 2) return kUnusable;
  const double k = t.per_host, N = n;
  // Inside a part: shared memory (hosts) or the hosts' links (racks, shared by the groups that
  // run beside this one).
  LinkCost in = t.level == Topology::Level::kHosts ? k_.shm() : k_.host();
  if (t.level == Topology::Level::kRacks) in.beta *= t.nic_sharers;
  // Hosts of one machine: every host's inner steps run at once, on the same cores and memory;
  // beyond the cache they share, at the rate measured so. As for a flat group below: four
  // buffers' worth a rank, times the ranks per core, here of the whole machine (every host's).
  if (t.level == Topology::Level::kHosts && t.one_machine &&
      4 * t.hosts * k * M * t.hosts * t.oversubscription >= k_.cache_bytes)
    in.beta = std::max(in.beta, k_.beta_machine_shm);
  const double lk = log2_ceil(static_cast<int>(k));
  Topology cross = cross_of(t);
  if (!t.uniform) cross.nic_sharers = t.nic_sharers;  // leaders only
  const double g = k_.gamma;
  switch (kind) {
    case CollectiveKind::kAllreduce:
      // Two collectives inside (their calls counted here), one across (best_cost counts its own).
      if (t.uniform)
        return 2 * k_.call + 2 * ((k - 1) * in.alpha + (k - 1) / k * M * in.beta) +
               (k - 1) / k * M * g + best_cost(kind, static_cast<size_t>(M / k), t.hosts, cross);
      // By leaders: reduce to each part's first rank, all-reduce among them, broadcast back.
      return 2 * k_.call + lk * (2 * in.alpha + 2 * M * in.beta + M * g) +
             best_cost(kind, static_cast<size_t>(M), t.hosts, cross);
    case CollectiveKind::kBroadcast:
      cross.nic_sharers = t.nic_sharers;
      return k_.call * (t.uniform ? 1 : 2) + lk * (in.alpha + M * in.beta) * (t.uniform ? 1 : 2) +
             best_cost(kind, static_cast<size_t>(M), t.hosts, cross);
    case CollectiveKind::kAllgather:
      if (!t.uniform) return kUnusable;
      cross.nic_sharers = t.nic_sharers;
      return 2 * k_.call + (k - 1) * (in.alpha + M * in.beta) + lk * (in.alpha + N * M * in.beta) +
             best_cost(kind, static_cast<size_t>(k * M), t.hosts, cross);
    default:
      return kUnusable;
  }
}

double CostModel::cost(std::string_view name, CollectiveKind kind, size_t bytes, int n,
                       const Topology& topology) const {
  const algo::Algorithm* a = algo::find(kind, name);
  return a == nullptr ? kUnusable : cost(*a, bytes, n, topology);
}

double CostModel::cost(const algo::Algorithm& a, size_t bytes, int n,
                       const Topology& topology) const {
  if (n <= 1) return 0.0;
  if (!algo::can_run(a, topology, n)) return kUnusable;
  if (a.cost == nullptr)
    return k_.call + hierarchical(a.kind, static_cast<double>(bytes), n, topology);
  return k_.call + a.cost(input(a, bytes, n, topology));
}

algo::CostInput CostModel::input(const algo::Algorithm& a, size_t bytes, int n,
                                 const Topology& topology) const {
  algo::CostInput c;
  c.M = static_cast<double>(bytes);
  c.N = n;
  // The slowest link the group's messages cross, and how many flows share it at once: one per
  // host for a ring over hosts that each hold consecutive ranks, every rank of a host (of a
  // rack, on its uplink) for the algorithms whose steps all leave the host together.
  if (topology.local) {
    c.link = k_.shm();
  } else {
    const bool ring = a.flows == algo::Flows::kOnePerHost;
    const bool hosts = topology.level == Topology::Level::kHosts;
    const double per_host = hosts ? topology.per_host : 1;
    const double per_rack = hosts ? topology.per_host * topology.hosts_per_rack : topology.per_host;
    const double host_flows = ring && (topology.host_contiguous || !hosts) ? 1 : per_host;
    const double rack_flows = ring ? 1 : per_rack;
    c.link = {k_.alpha, k_.beta * host_flows};
    if (topology.spans_racks) {
      c.link.alpha = std::max(c.link.alpha, k_.rack().alpha);
      c.link.beta = std::max(c.link.beta, k_.rack().beta * rack_flows);
    }
    // Hosts of one machine: every flow of the group (and of the groups beside it) also shares
    // what the machine's cores move through TCP in all.
    if (topology.one_machine && k_.beta_machine > 0) {
      const bool one_per_host = ring && hosts && topology.host_contiguous && topology.hosts > 1;
      const double flows = one_per_host ? topology.hosts : c.N;
      c.link.beta = std::max(c.link.beta, k_.beta_machine * flows);
    }
    c.link.beta *= topology.nic_sharers;
  }
  c.gamma = k_.gamma;
  // On shared memory, the ring-based algorithms copy every byte into a ring and out again:
  // nearly free while the ranks' buffers stay in cache (both copies run at once, on two
  // cores), three times the cost of one copy through memory beyond it. Each rank's working set
  // is about four times its buffer (the buffer, the scratch, and the bytes in both rings), and
  // ranks that share a core also share its cache. The crossovers this puts against `direct`,
  // and the measured ones: docs/algorithms.md, "Choosing".
  const bool spills = topology.local && 4 * c.N * c.M * topology.oversubscription >= k_.cache_bytes;
  c.reread = spills ? 2.0 : 0.0;
  c.trip = topology.local ? 2.0 : 1.0;
  c.chunks = c.M / (256.0 * 1024.0);
  c.p = static_cast<double>(std::bit_floor(static_cast<unsigned>(n)));
  c.lp = std::log2(c.p);
  c.log2n = log2_ceil(n);
  c.fold =
      n == static_cast<int>(c.p) ? 0.0 : 2 * c.link.alpha + 2 * c.M * c.link.beta + c.M * c.gamma;
  return c;
}

const algo::Algorithm& CostModel::pick(CollectiveKind kind, size_t bytes, int n,
                                       const Topology& topology) const {
  auto all = algo::algorithms_of(kind);
  DTRAIN_CHECK(!all.empty());
  const algo::Algorithm* best = all[0];
  double best_cost = cost(*best, bytes, n, topology);
  for (const algo::Algorithm* a : all.subspan(1)) {
    const double x = cost(*a, bytes, n, topology);
    if (x < best_cost) {
      best = a;
      best_cost = x;
    }
  }
  return *best;
}

double CostModel::best_cost(CollectiveKind kind, size_t bytes, int n, const Topology& t) const {
  return cost(pick(kind, bytes, n, t), bytes, n, t);
}

const algo::Algorithm& CostModel::choose(CollectiveKind kind, std::string_view requested,
                                         size_t bytes, int n, const Topology& topology) const {
  auto names = [&] {
    std::vector<std::string_view> out;
    for (const algo::Algorithm* a : algo::algorithms_of(kind)) out.push_back(a->name);
    return fmt::format("{}", fmt::join(out, ", "));
  };
  auto usable = [&](const algo::Algorithm& a) -> const algo::Algorithm& {
    if (std::string why = algo::unusable(a, topology, n); !why.empty())
      throw InvalidArgumentError(why);
    return a;
  };
  if (!requested.empty()) {
    if (const algo::Algorithm* a = algo::find(kind, requested)) return usable(*a);
    throw InvalidArgumentError(fmt::format("{} has no algorithm '{}': use one of {}",
                                           to_string(kind), requested, names()));
  }
  const std::string from_env = env_choice(kind, algo_env_);
  if (!from_env.empty()) {
    if (const algo::Algorithm* a = algo::find(kind, from_env)) return usable(*a);
    throw InvalidArgumentError(fmt::format("DTRAIN_ALGO asks {} to use '{}': use one of {}",
                                           to_string(kind), from_env, names()));
  }
  return pick(kind, bytes, n, topology);
}

}  // namespace dtrain::comm
