// Roles of a parameter-server job from the environment (conventions in dtrain/ps_cluster.h).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/env.h"
#include "common/json_integer.h"
#include "dtrain/error.h"
#include "dtrain/ps_cluster.h"

namespace dtrain::ps {

namespace {

class Reader {
 public:
  explicit Reader(const EnvLookup& lookup) : lookup_(lookup) {}
  std::optional<std::string> str(const env::Var& v) const {
    auto x = lookup_(v.name);
    if (!x || x->empty()) return std::nullopt;
    return x;
  }
  std::optional<int> integer(const env::Var& v, int min) const {
    auto x = str(v);
    if (!x) return std::nullopt;
    int64_t n = env::parse_int(v.name, *x);
    if (n < min || n > (1 << 30))
      throw InvalidArgumentError(fmt::format("{} is {}: it must be at least {}", v.name, *x, min));
    return static_cast<int>(n);
  }
  int required(const env::Var& v, int min, const char* why) const {
    auto n = integer(v, min);
    if (!n) throw InvalidArgumentError(fmt::format("{} is not set: {}", v.name, why));
    return *n;
  }

 private:
  const EnvLookup& lookup_;
};

Cluster::Role parse_role(const std::string& text, const char* variable) {
  if (text == "worker" || text == "chief") return Cluster::Role::kWorker;
  if (text == "server" || text == "ps") return Cluster::Role::kServer;
  if (text == "scheduler") return Cluster::Role::kScheduler;
  throw InvalidArgumentError(
      fmt::format("{} is '{}': use worker, server or scheduler", variable, text));
}

void check_index(const Cluster& c, const char* from) {
  const int count = c.role == Cluster::Role::kServer ? c.num_servers : c.num_workers;
  if (c.index >= count)
    throw InvalidArgumentError(
        fmt::format("{} is {} but there are only {} {}s", from, c.index, count, to_string(c.role)));
}

Cluster from_dtrain(const Reader& r, const std::string& role) {
  Cluster c;
  c.source = "dtrain";
  c.role = parse_role(role, "DTRAIN_ROLE");
  c.num_servers = r.required(env::kNumServers, 1, "a parameter-server job needs the server count");
  c.num_workers =
      r.integer(env::kNumWorkers, 1).value_or(r.integer(env::kWorldSize, 1).value_or(1));
  if (c.role == Cluster::Role::kServer) {
    c.index = r.required(env::kPsIndex, 0, "a server needs its index");
    check_index(c, "DTRAIN_PS_INDEX");
  } else if (c.role == Cluster::Role::kWorker) {
    c.index = r.integer(env::kRank, 0).value_or(0);
    check_index(c, "RANK");
  }
  c.store_addr = r.str(env::kMasterAddr).value_or("127.0.0.1");
  c.store_port = static_cast<uint16_t>(r.integer(env::kMasterPort, 1).value_or(29500));
  return c;
}

Cluster from_tf_config(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError(fmt::format(
        "TF_CONFIG {}: a parameter-server job needs {{\"cluster\": {{\"ps\": [\"host:port\", ...], "
        "\"worker\": [...]}}, \"task\": {{\"type\": \"ps\", \"index\": 0}}}}",
        why));
  };
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw bad("is not a JSON object");
  try {
    const auto& cluster = j.at("cluster");
    const auto& task = j.at("task");
    Cluster c;
    c.source = "tf_config";
    c.servers = cluster.at("ps").get<std::vector<std::string>>();
    std::vector<std::string> chief, workers;
    if (cluster.contains("chief")) chief = cluster.at("chief").get<std::vector<std::string>>();
    if (cluster.contains("worker")) workers = cluster.at("worker").get<std::vector<std::string>>();
    c.num_servers = static_cast<int>(c.servers.size());
    c.num_workers = static_cast<int>(chief.size() + workers.size());
    if (c.num_servers < 1) throw bad("lists no ps task");
    if (c.num_workers < 1) throw bad("lists no chief or worker task");
    const std::string type = task.at("type").get<std::string>();
    const int index = json_integer<int>(task.at("index"));
    if (index < 0) throw bad("has a negative task.index");
    if (type == "ps") {
      c.role = Cluster::Role::kServer;
      c.index = index;
    } else if (type == "chief") {
      c.role = Cluster::Role::kWorker;
      c.index = index;
    } else if (type == "worker") {
      c.role = Cluster::Role::kWorker;
      c.index = static_cast<int>(chief.size()) + index;
    } else {
      throw bad(fmt::format("has task.type \"{}\"", type));
    }
    check_index(c, "TF_CONFIG task.index");
    return c;
  } catch (const nlohmann::json::exception& e) {
    throw bad(e.what());
  }
}

Cluster from_dmlc(const Reader& r, const std::string& role) {
  Cluster c;
  c.source = "dmlc";
  c.role = parse_role(role, "DMLC_ROLE");
  c.num_servers = r.required(env::kDmlcNumServer, 1, "ps-lite jobs set the server count");
  c.num_workers = r.required(env::kDmlcNumWorker, 1, "ps-lite jobs set the worker count");
  c.index = -1;  // handed out by the store, in order of arrival, as ps-lite's scheduler does
  auto uri = r.str(env::kDmlcRootUri);
  if (!uri)
    throw InvalidArgumentError(
        "DMLC_PS_ROOT_URI is not set: ps-lite jobs name the scheduler's address there");
  c.store_addr = *uri;
  c.store_port = static_cast<uint16_t>(
      r.required(env::kDmlcRootPort, 1, "ps-lite jobs name the scheduler's port there"));
  return c;
}

}  // namespace

const char* to_string(Cluster::Role role) {
  switch (role) {
    case Cluster::Role::kWorker:
      return "worker";
    case Cluster::Role::kServer:
      return "server";
    case Cluster::Role::kScheduler:
      return "scheduler";
  }
  return "unknown";
}

Cluster resolve_cluster(const EnvLookup& lookup) {
  Reader r(lookup);
  if (auto role = r.str(env::kRole)) return from_dtrain(r, *role);
  if (auto tf = r.str(env::kTfConfig)) {
    nlohmann::json j = nlohmann::json::parse(*tf, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("cluster") && j["cluster"].is_object() &&
        j["cluster"].contains("ps"))
      return from_tf_config(*tf);
  }
  if (auto role = r.str(env::kDmlcRole)) return from_dmlc(r, *role);
  throw InvalidArgumentError(
      "this process has no parameter-server role: start it with `dtrain run --servers S -n N`, "
      "or set DTRAIN_ROLE (with DTRAIN_NUM_SERVERS), TF_CONFIG with a \"ps\" list, or DMLC_ROLE");
}

Cluster resolve_cluster() {
  return resolve_cluster([](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  });
}

}  // namespace dtrain::ps
