// Pieces of a sharded run's state (see shard_pieces.h).
#include "torch/shard_pieces.h"

#include <algorithm>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/optimizer.h>

#include "common/json_integer.h"
#include "dtrain/error.h"

namespace dtrain::shard_pieces {

namespace {

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The unit's optimizer state that is shaped like its shard (not the step), by name.
std::vector<std::pair<std::string, at::Tensor>> shard_states(
    const std::map<std::string, at::Tensor>& state, const ShardedUnit& unit, size_t u,
    std::optional<int64_t>* step) {
  const std::string prefix = fmt::format("optimizer.unit.{}.", u);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto it = state.lower_bound(prefix); it != state.end() && it->first.rfind(prefix, 0) == 0;
       ++it) {
    if (it->first == prefix + "step") {
      if (step != nullptr) *step = it->second.item<int64_t>();
    } else if (it->second.numel() == unit.shard_numel) {
      out.emplace_back(it->first.substr(prefix.size()), it->second);
    }
  }
  return out;
}

}  // namespace

std::optional<std::pair<int64_t, int64_t>> overlap(const ShardedUnit& unit, size_t i, int q) {
  const int64_t lo = std::max(q * unit.shard_numel, unit.offsets[i]);
  const int64_t hi =
      std::min((q + 1) * unit.shard_numel, unit.offsets[i] + numel_of(unit.shapes[i]));
  if (lo >= hi) return std::nullopt;
  return std::make_pair(lo, hi);
}

std::map<const void*, std::string> shard_names(const std::vector<at::Tensor>& shards) {
  std::map<const void*, std::string> names;
  for (size_t u = 0; u < shards.size(); ++u)
    names[shards[u].unsafeGetTensorImpl()] = fmt::format("unit.{}", u);
  return names;
}

std::map<std::string, at::Tensor> pieces_of(const std::vector<ShardedUnit>& units,
                                            const std::vector<at::Tensor>& shards,
                                            const std::map<std::string, at::Tensor>& state,
                                            int rank) {
  std::map<std::string, at::Tensor> pieces;
  for (size_t u = 0; u < units.size(); ++u) {
    const auto states = shard_states(state, units[u], u, nullptr);
    for (size_t i = 0; i < units[u].parameter_names.size(); ++i) {
      auto o = overlap(units[u], i, rank);
      if (!o) continue;
      const int64_t local = o->first - rank * units[u].shard_numel, count = o->second - o->first;
      const std::string& param = units[u].parameter_names[i];
      pieces[param] = shards[u].detach().narrow(0, local, count);
      for (const auto& [name, t] : states)
        pieces["optimizer." + param + "." + name] = t.narrow(0, local, count).contiguous();
    }
  }
  return pieces;
}

Json parameters_entry(const std::vector<ShardedUnit>& units,
                      const std::map<std::string, at::Tensor>& state, int n) {
  Json parameters = Json::array();
  for (size_t u = 0; u < units.size(); ++u) {
    std::optional<int64_t> step;
    Json states = Json::array();
    for (const auto& [name, t] : shard_states(state, units[u], u, &step)) states.push_back(name);
    for (size_t i = 0; i < units[u].parameter_names.size(); ++i) {
      Json pieces = Json::array();
      for (int q = 0; q < n; ++q)
        if (auto o = overlap(units[u], i, q))
          pieces.push_back({q, o->first - units[u].offsets[i], o->second - o->first});
      parameters.push_back({{"name", units[u].parameter_names[i]},
                            {"shape", units[u].shapes[i]},
                            {"pieces", pieces},
                            {"optimizer_states", states},
                            {"optimizer_step", step ? Json(*step) : Json(nullptr)}});
    }
  }
  return parameters;
}

void check_fits(const Json& parameters,
                const std::vector<std::pair<std::string, std::vector<int64_t>>>& model,
                const std::string& what) {
  std::map<std::string, std::vector<int64_t>> saved;
  for (const auto& p : parameters)
    saved[p.at("name").get<std::string>()] = p.at("shape").get<std::vector<int64_t>>();
  std::vector<std::string> problems;
  std::set<std::string> seen;
  for (const auto& [name, shape] : model) {
    seen.insert(name);
    auto it = saved.find(name);
    if (it == saved.end())
      problems.push_back(fmt::format("'{}' is not in the checkpoint", name));
    else if (it->second != shape)
      problems.push_back(fmt::format("'{}' has shape {} in the checkpoint, {} in the model", name,
                                     it->second, shape));
  }
  for (const auto& [name, shape] : saved)
    if (!seen.count(name)) problems.push_back(fmt::format("'{}' is not in the model", name));
  if (!problems.empty())
    throw InvalidArgumentError(
        fmt::format("{} does not fit the model: {}", what, fmt::join(problems, "; ")));
}

std::vector<std::pair<std::string, std::vector<int64_t>>> unit_parameters(
    const std::vector<ShardedUnit>& units) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> model;
  for (const auto& u : units)
    for (size_t i = 0; i < u.parameter_names.size(); ++i)
      model.emplace_back(u.parameter_names[i], u.shapes[i]);
  return model;
}

Json optimizer_entry(const Json& saved, const torch::optim::Optimizer& opt,
                     const std::map<const void*, std::string>& names, const std::string& what) {
  if (opt.param_groups().size() != 1)
    throw InvalidArgumentError(
        fmt::format("{}: the optimizer has {} param groups; sharded state holds one", what,
                    opt.param_groups().size()));
  Json params = Json::array();
  for (const auto& p : opt.param_groups()[0].params()) {
    auto it = names.find(p.unsafeGetTensorImpl());
    if (it == names.end())
      throw InvalidArgumentError(fmt::format(
          "{}: the optimizer holds a tensor of shape {} that is not a parameter of the model "
          "(give it the model's parameters, or sdp.parameters())",
          what, p.sizes().vec()));
    params.push_back(it->second);
  }
  return {{"type", saved.at("type")},
          {"param_groups", Json::array({{{"params", params}, {"options", saved.at("options")}}})}};
}

// ---------------------------------------------------------------------------------------------

ShardFiller::ShardFiller(const Json& parameters, const std::vector<ShardedUnit>& units, int rank,
                         bool with_optimizer, std::string what)
    : what_(std::move(what)) {
  std::map<std::string, const Json*> saved;
  for (const auto& p : parameters) saved[p.at("name").get<std::string>()] = &p;
  steps_.resize(units.size());
  states_.resize(units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t S = units[u].shard_numel;
    shards_.push_back(at::zeros({S}, at::kFloat));
    const Json& first = *saved.at(units[u].parameter_names[0]);
    if (with_optimizer && !first.at("optimizer_step").is_null()) {
      steps_[u] = json_integer<int64_t>(first.at("optimizer_step"));
      for (const auto& s : first.at("optimizer_states"))
        states_[u][s.get<std::string>()] = at::zeros({S}, at::kFloat);
    }
    for (size_t i = 0; i < units[u].parameter_names.size(); ++i) {
      auto o = overlap(units[u], i, rank);
      if (!o) continue;
      Need need{.unit = u,
                .param = units[u].parameter_names[i],
                .local = o->first - rank * S,
                .a = o->first - units[u].offsets[i],
                .b = o->second - units[u].offsets[i]};
      for (const auto& piece : saved.at(need.param)->at("pieces"))
        need.pieces.push_back({json_integer<int64_t>(piece.at(0)),
                               json_integer<int64_t>(piece.at(1)),
                               json_integer<int64_t>(piece.at(2))});
      needs_.push_back(std::move(need));
    }
  }
}

bool ShardFiller::needs(int q) const {
  for (const auto& need : needs_)
    for (const auto& [r, start, count] : need.pieces)
      if (r == q && std::max(need.a, start) < std::min(need.b, start + count)) return true;
  return false;
}

void ShardFiller::fill(int q, const Piece& piece) {
  for (auto& need : needs_)
    for (const auto& [r, start, count] : need.pieces) {
      const int64_t s = std::max(need.a, start), e = std::min(need.b, start + count);
      if (r != q || s >= e) continue;
      const int64_t at_shard = need.local + (s - need.a), at_piece = s - start;
      shards_[need.unit]
          .narrow(0, at_shard, e - s)
          .copy_(piece(need.param, count).narrow(0, at_piece, e - s));
      for (auto& [name, t] : states_[need.unit])
        t.narrow(0, at_shard, e - s)
            .copy_(piece("optimizer." + need.param + "." + name, count).narrow(0, at_piece, e - s));
      need.filled += e - s;
    }
}

void ShardFiller::finish(std::vector<at::Tensor>& shards,
                         std::map<std::string, at::Tensor>& state) {
  for (const auto& need : needs_)
    if (need.filled != need.b - need.a)
      throw InvalidArgumentError(
          fmt::format("{}: the pieces of '{}' cover {} of its elements [{}, {})", what_, need.param,
                      need.filled, need.a, need.b));
  shards = shards_;
  state.clear();
  for (size_t u = 0; u < shards_.size(); ++u) {
    if (!steps_[u]) continue;
    state[fmt::format("optimizer.unit.{}.step", u)] = at::tensor(*steps_[u], at::kLong);
    for (const auto& [name, t] : states_[u])
      state[fmt::format("optimizer.unit.{}.{}", u, name)] = t;
  }
}

}  // namespace dtrain::shard_pieces
