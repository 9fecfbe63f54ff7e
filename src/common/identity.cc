// Who am I: rank, world size, local rank and the master's address, from explicit options or from
// whichever launcher started this process. Each convention is read by one function that returns
// nothing when its variables are absent; the first that answers wins, then the generic checks run.
// Every value remembers the variable it came from so that an error can name it.
#include "dtrain/identity.h"

#include <algorithm>
#include <climits>
#include <cstdlib>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/env.h"
#include "common/socket.h"
#include "dtrain/error.h"

namespace dtrain {
namespace {

// More hosts than any Slurm cluster has: a typo like n[0-99999999] (or a product of ranges)
// fails at once instead of eating memory and time.
constexpr size_t kMaxHosts = 100'000;

struct Value {
  int value = 0;
  std::string from;  // "RANK", "IdentityOptions.rank", "TF_CONFIG task.index", ...
};

// What one convention says about this process; unset optionals fall back to the generic defaults.
struct Found {
  std::string source;
  Value rank;
  Value world_size;
  std::optional<Value> local_rank;
  std::optional<Value> local_world_size;
  std::optional<Value> node_rank;
  std::optional<std::string> master_addr;
  std::optional<uint16_t> master_port;
};

int to_int(std::string_view from, int64_t v) {
  if (v < 0) throw InvalidArgumentError(fmt::format("{} is {}: it must be 0 or more", from, v));
  if (v > INT_MAX)
    throw InvalidArgumentError(
        fmt::format("{} is {}: that is too large for a rank or size", from, v));
  return static_cast<int>(v);
}

class EnvReader {
 public:
  explicit EnvReader(const EnvLookup& lookup) : lookup_(lookup) {}

  // An empty value counts as unset, as in env::raw.
  std::optional<std::string> str(const env::Var& var) const {
    auto v = lookup_(var.name);
    if (!v || v->empty()) return std::nullopt;
    return v;
  }
  bool has(const env::Var& var) const { return str(var).has_value(); }

  // A whole number >= 0, or nullopt when unset.
  std::optional<Value> num(const env::Var& var) const {
    auto text = str(var);
    if (!text) return std::nullopt;
    return Value{to_int(var.name, env::parse_int(var.name, *text)), std::string(var.name)};
  }

  // `var` is needed because `because` is set.
  Value require(const env::Var& var, const env::Var& because, std::string_view what) const {
    auto v = num(var);
    if (!v)
      throw InvalidArgumentError(fmt::format("{} is set (to '{}') but {} is not: set {} to {}",
                                             because.name, *str(because), var.name, var.name,
                                             what));
    return *v;
  }

  // A local rank and local size that come as a pair: both or neither.
  void local_pair(const env::Var& rank_var, const env::Var& size_var, Found& found) const {
    auto lr = num(rank_var);
    auto ls = num(size_var);
    if (lr && !ls)
      throw InvalidArgumentError(fmt::format(
          "{} is set (to {}) but {} is not: set {} to the number of processes on this node",
          rank_var.name, lr->value, size_var.name, size_var.name));
    if (ls && !lr)
      throw InvalidArgumentError(
          fmt::format("{} is set (to {}) but {} is not: set {} to this process's index on its node",
                      size_var.name, ls->value, rank_var.name, rank_var.name));
    found.local_rank = lr;
    found.local_world_size = ls;
  }

  uint16_t port(const env::Var& var) const {
    auto text = str(var);
    int64_t v = env::parse_int(var.name, *text);
    if (v < 1 || v > 65535)
      throw InvalidArgumentError(
          fmt::format("{} is {}: it must be a TCP port between 1 and 65535", var.name, v));
    return static_cast<uint16_t>(v);
  }

 private:
  const EnvLookup& lookup_;
};

// A launcher variable that names the same thing as a torchrun one must agree with it: two
// launchers stacked on each other (mpirun around dtrain run) otherwise give silently wrong ranks.
void check_agrees(const EnvReader& env, const Value& mine, const env::Var& other) {
  auto theirs = env.num(other);
  if (theirs && theirs->value != mine.value)
    throw InvalidArgumentError(fmt::format(
        "{} is {} but {} is {}: two launchers disagree about this process; unset one of them "
        "({} comes from dtrain run or torchrun, {} from mpirun)",
        mine.from, mine.value, other.name, theirs->value, mine.from, other.name));
}

// What every launcher sets: this process's rank in `rank_var` (set: the caller checked) and
// the job's size in `size_var`, described as `size_what` when it is missing.
Found found_by(const EnvReader& env, std::string source, const env::Var& rank_var,
               const env::Var& size_var, std::string_view size_what) {
  Found f;
  f.source = std::move(source);
  f.rank = *env.num(rank_var);
  f.world_size = env.require(size_var, rank_var, size_what);
  return f;
}

std::optional<Found> from_torchrun(const EnvReader& env) {
  if (!env.has(env::kRank)) return std::nullopt;
  Found f =
      found_by(env, "torchrun", env::kRank, env::kWorldSize, "the number of processes in the job");
  check_agrees(env, f.rank, env::kOmpiRank);
  check_agrees(env, f.world_size, env::kOmpiSize);
  env.local_pair(env::kLocalRank, env::kLocalWorldSize, f);
  f.node_rank = env.num(env::kNodeRank);
  if (!f.node_rank) f.node_rank = env.num(env::kGroupRank);
  return f;
}

std::optional<Found> from_openmpi(const EnvReader& env) {
  if (!env.has(env::kOmpiRank)) return std::nullopt;
  Found f = found_by(env, "openmpi", env::kOmpiRank, env::kOmpiSize, "the number of processes");
  // OMPI_COMM_WORLD_NODE_RANK is a rank among the processes of a node, not the node's index, so
  // the node index is derived from the (by-slot) local size below.
  env.local_pair(env::kOmpiLocalRank, env::kOmpiLocalSize, f);
  return f;
}

std::optional<Found> from_pmi(const EnvReader& env) {
  if (!env.has(env::kPmiRank)) return std::nullopt;
  Found f = found_by(env, "pmi", env::kPmiRank, env::kPmiSize, "the number of processes");
  env.local_pair(env::kMpiLocalRankId, env::kMpiLocalNRanks, f);
  return f;
}

// "4(x2),3" -> 4 4 3; `name` is the variable it came from.
std::vector<int> expand_tasks_per_node(std::string_view name, std::string_view text) {
  std::vector<int> counts;
  auto bad = [&](std::string_view why) {
    return InvalidArgumentError(
        fmt::format("{} is '{}': {}; it must look like 4(x2),3", name, text, why));
  };
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string_view item =
        text.substr(pos, comma == std::string_view::npos ? text.npos : comma - pos);
    size_t paren = item.find('(');
    int64_t count = env::parse_int(name, item.substr(0, paren));
    int64_t repeat = 1;
    if (paren != std::string_view::npos) {
      if (item.size() < paren + 4 || item.substr(paren, 2) != "(x" || item.back() != ')')
        throw bad(fmt::format("'{}' is not N(xM)", item));
      repeat = env::parse_int(name, item.substr(paren + 2, item.size() - paren - 3));
    }
    if (count < 0 || repeat < 1 || counts.size() + repeat > kMaxHosts)
      throw bad(fmt::format("'{}' is not a task count", item));
    counts.insert(counts.end(), static_cast<size_t>(repeat), static_cast<int>(count));
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return counts;
}

std::optional<Found> from_slurm(const EnvReader& env) {
  if (!env.has(env::kSlurmProcId)) return std::nullopt;
  Found f = found_by(env, "slurm", env::kSlurmProcId, env::kSlurmNTasks, "the number of tasks");
  f.local_rank = env.num(env::kSlurmLocalId).value_or(Value{0, "SLURM_LOCALID"});
  Value node = env.num(env::kSlurmNodeId).value_or(Value{0, "SLURM_NODEID"});
  f.node_rank = node;

  // srun describes its step (SLURM_STEP_*), which may use only part of the job's allocation;
  // SLURM_PROCID and SLURM_NODEID count within the step, so its node list is the one to read.
  const env::Var& list_var =
      env.has(env::kSlurmStepNodeList) ? env::kSlurmStepNodeList : env::kSlurmNodeList;
  const env::Var& tpn_var =
      env.has(env::kSlurmStepTasksPerNode) ? env::kSlurmStepTasksPerNode : env::kSlurmTasksPerNode;
  size_t num_nodes = 1;
  if (auto list = env.str(list_var)) {
    std::vector<std::string> hosts;
    try {
      hosts = expand_slurm_nodelist(*list);
    } catch (const InvalidArgumentError& e) {
      throw InvalidArgumentError(fmt::format("{}: {}", list_var.name, e.what()));
    }
    if (!hosts.empty()) f.master_addr = hosts.front();
    num_nodes = std::max<size_t>(hosts.size(), 1);
  }
  if (auto tpn = env.str(tpn_var)) {
    auto counts = expand_tasks_per_node(tpn_var.name, *tpn);
    if (static_cast<size_t>(node.value) >= counts.size())
      throw InvalidArgumentError(fmt::format(
          "SLURM_NODEID is {} but {} '{}' describes only {} node(s): the node index must be "
          "below the number of nodes",
          node.value, tpn_var.name, *tpn, counts.size()));
    f.local_world_size = Value{counts[node.value], std::string(tpn_var.name)};
  } else {
    // Without the per-node counts, assume the tasks are spread evenly over the listed nodes.
    int per_node = static_cast<int>((f.world_size.value + num_nodes - 1) / num_nodes);
    f.local_world_size =
        Value{std::max(per_node, 1), fmt::format("SLURM_NTASKS / nodes of {}", list_var.name)};
  }
  return f;
}

std::optional<Found> from_kubernetes(const EnvReader& env) {
  if (!env.has(env::kJobCompletionIndex)) return std::nullopt;
  Found f = found_by(env, "kubernetes", env::kJobCompletionIndex, env::kWorldSize,
                     "the Job's completions (the number of pods)");
  if (!env.has(env::kMasterAddr))
    throw InvalidArgumentError(fmt::format(
        "JOB_COMPLETION_INDEX is set (to '{}') but MASTER_ADDR is not: set MASTER_ADDR to the DNS "
        "name of pod 0, e.g. <job>-0.<headless service>",
        *env.str(env::kJobCompletionIndex)));
  return f;
}

std::optional<Found> from_tf_config(const EnvReader& env) {
  auto text = env.str(env::kTfConfig);
  if (!text) return std::nullopt;
  auto bad = [](std::string_view why) {
    return InvalidArgumentError(fmt::format(
        "TF_CONFIG {}: it must look like {{\"cluster\": {{\"worker\": [\"host:port\", ...]}}, "
        "\"task\": {{\"type\": \"worker\", \"index\": 0}}}}",
        why));
  };
  nlohmann::json config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) throw bad("is not valid JSON");
  if (!config.is_object() || !config.contains("cluster") || !config["cluster"].is_object())
    throw bad("has no \"cluster\" object");
  if (!config.contains("task") || !config["task"].is_object()) throw bad("has no \"task\" object");
  const auto& cluster = config["cluster"];
  const auto& task = config["task"];

  auto hosts_of = [&](const char* role) {
    std::vector<std::string> hosts;
    if (!cluster.contains(role)) return hosts;
    if (!cluster[role].is_array()) throw bad(fmt::format("cluster.{} is not a list", role));
    for (const auto& h : cluster[role]) {
      if (!h.is_string()) throw bad(fmt::format("cluster.{} holds a non-string entry", role));
      hosts.push_back(h.get<std::string>());
    }
    return hosts;
  };
  // TF1 called the chief "master"; either one is rank 0 of the all-reduce world.
  auto chiefs = hosts_of("chief");
  auto masters = hosts_of("master");
  chiefs.insert(chiefs.end(), masters.begin(), masters.end());
  auto workers = hosts_of("worker");
  if (chiefs.size() > 1)
    throw bad(fmt::format("lists {} chiefs: at most one is allowed", chiefs.size()));
  if (chiefs.empty() && workers.empty()) throw bad("lists no chief and no worker");

  if (!task.contains("type") || !task["type"].is_string()) throw bad("has no task.type string");
  std::string type = task["type"].get<std::string>();
  int64_t index = 0;
  if (task.contains("index")) {
    if (!task["index"].is_number_integer()) throw bad("has a task.index that is not an integer");
    index = task["index"].get<int64_t>();
  }
  int chief_count = static_cast<int>(chiefs.size());
  Found f;
  f.source = "tf_config";
  f.world_size =
      Value{chief_count + static_cast<int>(workers.size()), "TF_CONFIG (chief + worker count)"};
  if (type == "chief" || type == "master") {
    if (chief_count == 0)
      throw bad(fmt::format("has task.type \"{}\" but no cluster.{}", type, type));
    if (index != 0) throw bad(fmt::format("has task.index {} for the only {}", index, type));
    f.rank = Value{0, "TF_CONFIG task.index"};
  } else if (type == "worker") {
    if (index < 0 || index >= static_cast<int64_t>(workers.size()))
      throw bad(fmt::format("has task.index {} but cluster.worker lists {} worker(s)", index,
                            workers.size()));
    f.rank = Value{chief_count + static_cast<int>(index), "TF_CONFIG task.index"};
  } else {
    throw InvalidArgumentError(fmt::format(
        "TF_CONFIG has task.type \"{}\": only chief and worker tasks are ranks of the all-reduce "
        "world (run a parameter server with `dtrain ps-server`)",
        type));
  }
  const std::string& first = chief_count > 0 ? chiefs.front() : workers.front();
  auto hp = net::parse_host_port(
      first, chief_count > 0 ? "TF_CONFIG chief" : "TF_CONFIG cluster.worker[0]");
  f.master_addr = hp.host;
  if (hp.port != 0) f.master_port = hp.port;
  f.local_rank = Value{0, "TF_CONFIG"};
  f.local_world_size = Value{1, "TF_CONFIG"};
  f.node_rank = Value{f.rank.value, "TF_CONFIG task.index"};
  return f;
}

Found from_options(const IdentityOptions& o) {
  if (o.rank.has_value() != o.world_size.has_value())
    throw InvalidArgumentError(
        fmt::format("IdentityOptions.{} is set but IdentityOptions.{} is not: give both or neither",
                    o.rank ? "rank" : "world_size", o.rank ? "world_size" : "rank"));
  Found f;
  f.source = "options";
  f.rank = Value{*o.rank, "IdentityOptions.rank"};
  f.world_size = Value{*o.world_size, "IdentityOptions.world_size"};
  return f;
}

Found from_environment(const EnvReader& env) {
  for (auto* convention :
       {from_torchrun, from_openmpi, from_pmi, from_slurm, from_kubernetes, from_tf_config}) {
    if (auto f = convention(env)) return *f;
  }
  // WORLD_SIZE alone says the job has several processes but not which one this is.
  if (auto ws = env.num(env::kWorldSize); ws && ws->value != 1)
    throw InvalidArgumentError(
        fmt::format("WORLD_SIZE is {} but nothing gives this process's rank: set RANK (or "
                    "JOB_COMPLETION_INDEX in a Kubernetes Indexed Job)",
                    ws->value));
  Found f;
  f.source = "single";
  f.rank = Value{0, "RANK"};
  f.world_size = Value{1, "WORLD_SIZE"};
  return f;
}

// tcp://host:port sets the master; file:///path selects the file store.
void apply_init_method(const std::string& url, Identity& id, std::optional<std::string>& addr,
                       std::optional<uint16_t>& port) {
  constexpr std::string_view kTcp = "tcp://", kFile = "file://";
  std::string_view u = url;
  auto bad = [&](std::string_view why) {
    return InvalidArgumentError(fmt::format(
        "init_method is '{}': {}; use env://, tcp://host:port or file:///path/to/store", url, why));
  };
  if (u.empty() || u == "env://") return;
  if (u.starts_with(kTcp)) {
    std::string_view rest = u.substr(kTcp.size());
    if (rest.ends_with('/')) rest.remove_suffix(1);
    net::HostPort hp;
    try {
      hp = net::parse_host_port(rest, "the address");
    } catch (const InvalidArgumentError& e) {
      throw bad(e.what());
    }
    if (hp.port == 0) throw bad("port 0 cannot be connected to; give the store's port");
    addr = hp.host;
    port = hp.port;
  } else if (u.starts_with(kFile)) {
    std::string_view path = u.substr(kFile.size());
    if (!path.starts_with('/') || path.size() < 2)
      throw bad("a file store needs an absolute path (three slashes: file:///shared/store)");
    id.store_kind = "file";
    id.store_path = std::string(path);
  } else {
    throw bad("unknown scheme");
  }
}

void validate(const Found& f, const Identity& id, const Value& local_rank,
              const Value& local_size) {
  if (id.world_size < 1)
    throw InvalidArgumentError(fmt::format("{} is {}: the world needs at least one process",
                                           f.world_size.from, id.world_size));
  if (id.rank < 0 || id.rank >= id.world_size)
    throw InvalidArgumentError(fmt::format("{} is {} but {} is {}: a rank must be between 0 and {}",
                                           f.rank.from, id.rank, f.world_size.from, id.world_size,
                                           id.world_size - 1));
  if (id.local_world_size < 1)
    throw InvalidArgumentError(fmt::format("{} is {}: a node runs at least one process",
                                           local_size.from, id.local_world_size));
  if (id.local_rank < 0 || id.local_rank >= id.local_world_size)
    throw InvalidArgumentError(
        fmt::format("{} is {} but {} is {}: a local rank must be between 0 and {}", local_rank.from,
                    id.local_rank, local_size.from, id.local_world_size, id.local_world_size - 1));
  if (id.local_world_size > id.world_size)
    throw InvalidArgumentError(
        fmt::format("{} is {} but {} is {}: a node cannot run more processes than the whole job",
                    local_size.from, id.local_world_size, f.world_size.from, id.world_size));
  if (id.node_rank < 0)
    throw InvalidArgumentError(
        fmt::format("the node rank is {}: it must be 0 or more", id.node_rank));
}

// Splits at commas outside brackets: "a[1,2],b" -> "a[1,2]" "b".
std::vector<std::string_view> split_top_level(std::string_view list) {
  std::vector<std::string_view> items;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    char c = list[i];
    if (c == '[' && ++depth > 1)
      throw InvalidArgumentError(fmt::format("host list '{}' nests brackets", list));
    if (c == ']' && --depth < 0)
      throw InvalidArgumentError(fmt::format("host list '{}' has a ']' without '['", list));
    if (c == ',' && depth == 0) {
      items.push_back(list.substr(start, i - start));
      start = i + 1;
    }
  }
  if (depth != 0)
    throw InvalidArgumentError(fmt::format("host list '{}' has an unclosed '['", list));
  items.push_back(list.substr(start));
  return items;
}

struct HostRange {
  int lo, hi;
  size_t width;  // Slurm pads every number of a range to the width of its lower bound: n[001-010]
};

// The ranges of a bracket group's body ("1-3,5" -> [1,3] [5,5]).
std::vector<HostRange> ranges_of(std::string_view list, std::string_view body) {
  if (body.empty())
    throw InvalidArgumentError(fmt::format("host list '{}' has an empty '[]'", list));
  std::vector<HostRange> ranges;
  size_t pos = 0;
  while (pos <= body.size()) {
    size_t comma = body.find(',', pos);
    std::string_view range =
        body.substr(pos, comma == std::string_view::npos ? body.npos : comma - pos);
    size_t dash = range.find('-');
    std::string_view lo_text = range.substr(0, dash);
    std::string_view hi_text = dash == std::string_view::npos ? lo_text : range.substr(dash + 1);
    auto number = [&](std::string_view t) {
      bool digits = !t.empty() && t.size() <= 9 &&
                    std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!digits)
        throw InvalidArgumentError(fmt::format(
            "host list '{}' has range '{}': use numbers like [1-3,5] or [001-010]", list, range));
      return std::stoi(std::string(t));
    };
    HostRange r{number(lo_text), number(hi_text), lo_text.size()};
    if (r.hi < r.lo)
      throw InvalidArgumentError(
          fmt::format("host list '{}' has range '{}' that runs backwards", list, range));
    ranges.push_back(r);
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return ranges;
}

// How many hosts `pattern` names, counted without building them and saturating above
// kMaxHosts: a short list can name billions ("n[0-99999][0-99999]").
size_t count_pattern(std::string_view list, std::string_view pattern) {
  size_t open = pattern.find('[');
  if (open == std::string_view::npos) return 1;
  size_t close = pattern.find(']', open);
  size_t in_group = 0;
  for (const auto& r : ranges_of(list, pattern.substr(open + 1, close - open - 1)))
    in_group = std::min(kMaxHosts + 1, in_group + static_cast<size_t>(r.hi - r.lo) + 1);
  const size_t rest = count_pattern(list, pattern.substr(close + 1));
  return rest > (kMaxHosts + 1) / in_group ? kMaxHosts + 1 : in_group * rest;
}

// Expands the first bracket group of `pattern` and recurses on the rest, so that several groups
// ("rack[1-2]-n[01-02]") give their cartesian product.
void expand_pattern(std::string_view list, std::string_view pattern, const std::string& prefix,
                    std::vector<std::string>& out) {
  size_t open = pattern.find('[');
  if (open == std::string_view::npos) {
    out.push_back(prefix + std::string(pattern));
    return;
  }
  size_t close = pattern.find(']', open);
  std::string head = prefix + std::string(pattern.substr(0, open));
  std::string_view tail = pattern.substr(close + 1);
  for (const auto& r : ranges_of(list, pattern.substr(open + 1, close - open - 1)))
    for (int v = r.lo; v <= r.hi; ++v)
      expand_pattern(list, tail, fmt::format("{}{:0{}}", head, v, r.width), out);
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(std::string_view list) {
  std::vector<std::string> hosts;
  for (std::string_view item : split_top_level(list)) {
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.empty()) continue;
    if (hosts.size() + count_pattern(list, item) > kMaxHosts)
      throw InvalidArgumentError(
          fmt::format("host list '{}' names more than {} hosts", list, kMaxHosts));
    expand_pattern(list, item, "", hosts);
  }
  return hosts;
}

Identity resolve_identity(const IdentityOptions& options, const EnvLookup& lookup) {
  EnvReader env(lookup);
  bool explicit_world = options.rank.has_value() || options.world_size.has_value();
  Found f = explicit_world ? from_options(options) : from_environment(env);

  Identity id;
  id.source = f.source;
  id.rank = f.rank.value;
  id.world_size = f.world_size.value;

  // Without per-node information every process is taken to be alone on its node: right for one
  // process per pod or container, and it never makes two hosts believe they share memory.
  Value local_rank = f.local_rank.value_or(Value{0, "LOCAL_RANK"});
  Value local_size = f.local_world_size.value_or(Value{1, "LOCAL_WORLD_SIZE"});
  if (options.local_rank) local_rank = Value{*options.local_rank, "IdentityOptions.local_rank"};
  if (options.local_world_size)
    local_size = Value{*options.local_world_size, "IdentityOptions.local_world_size"};
  id.local_rank = local_rank.value;
  id.local_world_size = local_size.value;
  if (options.node_rank) {
    id.node_rank = *options.node_rank;
  } else if (f.node_rank) {
    id.node_rank = f.node_rank->value;
  } else {
    id.node_rank = id.local_world_size > 0 ? id.rank / id.local_world_size : 0;
  }

  // Master: options, then the init URL, then MASTER_ADDR/MASTER_PORT, then the convention's.
  std::optional<std::string> url_addr;
  std::optional<uint16_t> url_port;
  apply_init_method(options.init_method, id, url_addr, url_port);
  if (options.master_addr) {
    id.master_addr = *options.master_addr;
  } else if (url_addr) {
    id.master_addr = *url_addr;
  } else if (auto a = env.str(env::kMasterAddr)) {
    id.master_addr = *a;
  } else if (f.master_addr) {
    id.master_addr = *f.master_addr;
  }
  if (options.master_port) {
    id.master_port = *options.master_port;
  } else if (url_port) {
    id.master_port = *url_port;
  } else if (env.has(env::kMasterPort)) {
    id.master_port = env.port(env::kMasterPort);
  } else if (f.master_port) {
    id.master_port = *f.master_port;
  }

  validate(f, id, local_rank, local_size);
  return id;
}

Identity resolve_identity(const IdentityOptions& options) {
  return resolve_identity(options, [](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

}  // namespace dtrain
