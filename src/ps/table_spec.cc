#include "ps/table_spec.h"

#include <fmt/format.h>

#include "common/json_integer.h"
#include "dtrain/error.h"
#include "ps/optimizer.h"

namespace dtrain::ps {

namespace {

template <typename E>
E parse_enum(const std::string& text, std::initializer_list<std::pair<const char*, E>> names,
             const char* field) {
  for (const auto& [n, e] : names)
    if (text == n) return e;
  throw InvalidArgumentError(fmt::format("table spec: {} '{}' is not known", field, text));
}

const char* to_string(RowInit::Kind k) {
  switch (k) {
    case RowInit::Kind::kZeros:
      return "zeros";
    case RowInit::Kind::kUniform:
      return "uniform";
    case RowInit::Kind::kNormal:
      return "normal";
  }
  return "unknown";
}

}  // namespace

const char* to_string(Consistency c) {
  switch (c) {
    case Consistency::kSync:
      return "sync";
    case Consistency::kAsync:
      return "async";
    case Consistency::kBounded:
      return "ssp";
  }
  return "unknown";
}

nlohmann::json to_json(const TableSpec& s) {
  const auto& o = s.options.optimizer;
  nlohmann::json j = {
      {"name", s.name},
      {"sparse", s.sparse},
      {"workers", s.num_workers},
      {"consistency", to_string(s.options.consistency)},
      {"staleness", s.options.staleness},
      {"optimizer",
       {{"kind", to_string(o.kind)},
        {"lr", o.lr},
        {"momentum", o.momentum},
        {"beta1", o.beta1},
        {"beta2", o.beta2},
        {"eps", o.eps},
        {"weight_decay", o.weight_decay},
        {"initial_accumulator", o.initial_accumulator}}},
  };
  if (s.sparse) {
    j["width"] = s.width;
    j["init"] = {
        {"kind", to_string(s.init.kind)}, {"a", s.init.a}, {"b", s.init.b}, {"seed", s.init.seed}};
    j["evict_after_s"] = s.evict_after_s;
  } else {
    j["numel"] = s.numel;
    j["slice_offset"] = s.slice_offset;
    j["slice_length"] = s.slice_length;
  }
  return j;
}

TableSpec spec_from_json(const nlohmann::json& j) {
  try {
    TableSpec s;
    s.name = j.at("name").get<std::string>();
    s.sparse = j.at("sparse").get<bool>();
    s.num_workers = json_integer<int>(j.at("workers"));
    s.options.consistency = parse_enum<Consistency>(j.at("consistency").get<std::string>(),
                                                    {{"sync", Consistency::kSync},
                                                     {"async", Consistency::kAsync},
                                                     {"ssp", Consistency::kBounded}},
                                                    "consistency");
    s.options.staleness = json_integer<uint32_t>(j.at("staleness"));
    const auto& jo = j.at("optimizer");
    auto& o = s.options.optimizer;
    o.kind = parse_enum<OptimizerOptions::Kind>(jo.at("kind").get<std::string>(),
                                                {{"sgd", OptimizerOptions::Kind::kSgd},
                                                 {"momentum", OptimizerOptions::Kind::kMomentum},
                                                 {"adam", OptimizerOptions::Kind::kAdam},
                                                 {"adagrad", OptimizerOptions::Kind::kAdagrad},
                                                 {"sum", OptimizerOptions::Kind::kSum}},
                                                "optimizer");
    o.lr = jo.at("lr").get<float>();
    o.momentum = jo.at("momentum").get<float>();
    o.beta1 = jo.at("beta1").get<float>();
    o.beta2 = jo.at("beta2").get<float>();
    o.eps = jo.at("eps").get<float>();
    o.weight_decay = jo.at("weight_decay").get<float>();
    o.initial_accumulator = jo.at("initial_accumulator").get<float>();
    if (s.sparse) {
      s.width = json_integer<uint64_t>(j.at("width"));
      const auto& ji = j.at("init");
      s.init.kind = parse_enum<RowInit::Kind>(ji.at("kind").get<std::string>(),
                                              {{"zeros", RowInit::Kind::kZeros},
                                               {"uniform", RowInit::Kind::kUniform},
                                               {"normal", RowInit::Kind::kNormal}},
                                              "init");
      s.init.a = ji.at("a").get<float>();
      s.init.b = ji.at("b").get<float>();
      s.init.seed = json_integer<uint64_t>(ji.at("seed"));
      s.evict_after_s = json_integer<int64_t>(j.at("evict_after_s"));
    } else {
      s.numel = json_integer<uint64_t>(j.at("numel"));
      s.slice_offset = json_integer<uint64_t>(j.at("slice_offset"));
      s.slice_length = json_integer<uint64_t>(j.at("slice_length"));
    }
    // Bounds, so that no size from the wire can overflow the server's arithmetic.
    if (s.num_workers < 1 || s.num_workers > (1 << 20))
      throw InvalidArgumentError(fmt::format("table spec: {} workers", s.num_workers));
    if (s.sparse && (s.width == 0 || s.width > (uint64_t{1} << 20)))
      throw InvalidArgumentError(
          fmt::format("table spec: sparse table '{}' has rows of width {}; allowed: 1 to {}",
                      s.name, s.width, uint64_t{1} << 20));
    if (!s.sparse && (s.numel > (uint64_t{1} << 40) || s.slice_length > s.numel ||
                      s.slice_offset > s.numel - s.slice_length))
      throw InvalidArgumentError(fmt::format(
          "table spec: dense table '{}' of {} elements with the slice [{}, +{}) is out of range",
          s.name, s.numel, s.slice_offset, s.slice_length));
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgumentError(fmt::format("table spec: {}", e.what()));
  }
}

std::string spec_mismatch(const TableSpec& a, const TableSpec& b) {
  // Everything but the name (equal by construction) must match: compare the JSON forms and name
  // the first field that differs.
  nlohmann::json ja = to_json(a), jb = to_json(b);
  for (auto it = ja.begin(); it != ja.end(); ++it) {
    auto other = jb.find(it.key());
    if (other == jb.end()) return fmt::format("{} is missing from the request", it.key());
    if (*other != it.value())
      return fmt::format("{} is {} in the request but {} in the existing table", it.key(),
                         other->dump(), it.value().dump());
  }
  for (auto it = jb.begin(); it != jb.end(); ++it)
    if (!ja.contains(it.key()))
      return fmt::format("{} is not part of the existing table", it.key());
  return "";
}

}  // namespace dtrain::ps
