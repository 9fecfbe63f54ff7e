#include "ps/sparse_table.h"

#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/json_integer.h"
#include "dtrain/error.h"
#include "ps/optimizer.h"
#include "ps/placement.h"

namespace dtrain::ps {

namespace {

constexpr uint32_t kFree = UINT32_MAX;

// Uniform in [0, 1) from a 64-bit hash.
float unit(uint64_t h) { return static_cast<float>(h >> 40) * 0x1p-24f; }

template <typename T>
std::vector<std::byte> as_bytes(const std::vector<T>& v) {
  std::vector<std::byte> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

}  // namespace

SparseTable::SparseTable(TableSpec spec)
    : spec_(std::move(spec)),
      state_k_(state_per_weight(spec_.options.optimizer.kind)),
      stride_(spec_.width * (1 + state_k_)),
      epoch_(std::chrono::steady_clock::now()),
      clocks_(spec_.options.consistency, spec_.options.staleness, spec_.num_workers) {
  if (spec_.width == 0)
    throw InvalidArgumentError(fmt::format("sparse table '{}' has rows of width 0", spec_.name));
}

void SparseTable::init_row(const TableSpec& spec, uint64_t id, float* row) {
  const RowInit& init = spec.init;
  for (uint64_t j = 0; j < spec.width; ++j) {
    const uint64_t h = mix64(mix64(id ^ init.seed) + j);
    switch (init.kind) {
      case RowInit::Kind::kZeros:
        row[j] = 0.0f;
        break;
      case RowInit::Kind::kUniform:
        row[j] = init.a + (init.b - init.a) * unit(h);
        break;
      case RowInit::Kind::kNormal: {  // Box-Muller from two independent uniforms
        float u1 = std::max(unit(h), 0x1p-24f), u2 = unit(mix64(h));
        row[j] = init.a + init.b * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
        break;
      }
    }
  }
}

uint32_t SparseTable::now_s() const {
  return static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - epoch_)
          .count());
}

uint32_t SparseTable::slot_of(uint64_t id) {
  auto it = index_.find(id);
  if (it != index_.end()) return it->second;
  uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    slot = static_cast<uint32_t>(ids_.size());
    ids_.push_back(0);
    steps_.push_back(0);
    touched_.push_back(0);
    arena_.resize(arena_.size() + stride_);
  }
  ids_[slot] = id;
  steps_[slot] = 0;
  float* row = arena_.data() + size_t{slot} * stride_;
  init_row(spec_, id, row);
  init_state(spec_.options.optimizer, row + spec_.width, spec_.width);
  index_.emplace(id, slot);
  return slot;
}

void SparseTable::apply_rows(std::span<const uint64_t> ids, const float* grads, float scale) {
  const uint32_t now = now_s();
  const auto& opt = spec_.options.optimizer;
  const bool replace =
      opt.kind == OptimizerOptions::Kind::kSum && spec_.options.consistency == Consistency::kSync;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t slot = slot_of(ids[i]);
    float* row = arena_.data() + size_t{slot} * stride_;
    const float* g = grads + i * spec_.width;
    touched_[slot] = now;
    ++steps_[slot];
    if (replace) {
      std::memcpy(row, g, spec_.width * sizeof(float));
    } else {
      // Per-row planar state: apply_update's state[k * n + i] with n = width.
      apply_update(opt, row, row + spec_.width, g, spec_.width, scale, steps_[slot]);
    }
  }
}

void SparseTable::apply_complete() {
  for (;;) {
    auto it = pending_.find(clocks_.version());
    if (it == pending_.end() || !clocks_.complete(clocks_.version())) return;
    const bool sum_only = spec_.options.optimizer.kind == OptimizerOptions::Kind::kSum;
    apply_rows(it->second.ids, it->second.sums.data(),
               sum_only ? 1.0f : 1.0f / it->second.contributors);
    pending_.erase(it);
    clocks_.on_applied();
  }
}

void SparseTable::push(int w, std::span<const uint64_t> ids, const float* grads) {
  const uint64_t version = clocks_.on_push(w);
  if (spec_.options.consistency != Consistency::kSync) {
    apply_rows(ids, grads, 1.0f);
    return;
  }
  Pending& p = pending_[version];
  for (size_t i = 0; i < ids.size(); ++i) {
    const float* g = grads + i * spec_.width;
    auto [it, fresh] = p.where.emplace(ids[i], p.ids.size());
    if (fresh) {
      p.ids.push_back(ids[i]);
      p.sums.insert(p.sums.end(), g, g + spec_.width);
    } else {
      float* s = p.sums.data() + it->second * spec_.width;
      for (uint64_t j = 0; j < spec_.width; ++j) s[j] += g[j];
    }
  }
  ++p.contributors;
  apply_complete();
}

void SparseTable::read(std::span<const uint64_t> ids, float* out) {
  const uint32_t now = now_s();
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t slot = slot_of(ids[i]);
    touched_[slot] = now;
    std::memcpy(out + i * spec_.width, arena_.data() + size_t{slot} * stride_,
                spec_.width * sizeof(float));
  }
}

void SparseTable::set_presence(int w, WorkerClocks::Presence p) {
  clocks_.set_presence(w, p);
  apply_complete();
}

void SparseTable::forget(int w) {
  clocks_.set_presence(w, WorkerClocks::Presence::kLeft);
  pending_.clear();
  clocks_.rewind();
}

std::string SparseTable::describe_clocks() const {
  return fmt::format("version {}, pushes per worker {}", clocks_.version(), clocks_.clocks());
}

size_t SparseTable::evict(std::chrono::steady_clock::time_point now) {
  if (spec_.evict_after_s <= 0) return 0;
  const auto age = std::chrono::duration_cast<std::chrono::seconds>(now - epoch_).count();
  if (age < spec_.evict_after_s) return 0;
  const uint32_t cutoff = static_cast<uint32_t>(age - spec_.evict_after_s);
  size_t dropped = 0;
  for (uint32_t slot = 0; slot < ids_.size(); ++slot) {
    if (steps_[slot] == kFree || touched_[slot] > cutoff) continue;
    auto it = index_.find(ids_[slot]);
    if (it == index_.end() || it->second != slot) continue;
    index_.erase(it);
    steps_[slot] = kFree;
    free_.push_back(slot);
    ++dropped;
  }
  return dropped;
}

nlohmann::json SparseTable::save(const std::string& prefix,
                                 std::vector<SafetensorsEntry>& out) const {
  // Live rows only, compacted: ids, their values+state, their update counts.
  std::vector<uint64_t> ids, steps;
  std::vector<float> rows;
  ids.reserve(index_.size());
  for (const auto& [id, slot] : index_) {
    ids.push_back(id);
    steps.push_back(steps_[slot]);
    const float* r = arena_.data() + size_t{slot} * stride_;
    rows.insert(rows.end(), r, r + stride_);
  }
  const int64_t n = static_cast<int64_t>(ids.size());
  out.push_back({prefix + "ids", "U64", {n}, as_bytes(ids)});
  out.push_back({prefix + "steps", "U64", {n}, as_bytes(steps)});
  out.push_back({prefix + "rows", "F32", {n, static_cast<int64_t>(stride_)}, as_bytes(rows)});
  nlohmann::json pending = nlohmann::json::object();
  for (const auto& [v, p] : pending_) {
    const int64_t m = static_cast<int64_t>(p.ids.size());
    out.push_back({fmt::format("{}pending{}.ids", prefix, v), "U64", {m}, as_bytes(p.ids)});
    out.push_back({fmt::format("{}pending{}.sums", prefix, v),
                   "F32",
                   {m, static_cast<int64_t>(spec_.width)},
                   as_bytes(p.sums)});
    pending[std::to_string(v)] = p.contributors;
  }
  return {{"spec", to_json(spec_)},
          {"version", clocks_.version()},
          {"clocks", clocks_.clocks()},
          {"pending", pending}};
}

void SparseTable::restore(const nlohmann::json& meta, const std::string& prefix,
                          const std::map<std::string, const SafetensorsEntry*>& tensors) {
  auto tensor = [&](const std::string& name, const char* dtype) -> const SafetensorsEntry& {
    auto it = tensors.find(name);
    if (it == tensors.end() || it->second->dtype != dtype)
      throw InvalidArgumentError(fmt::format(
          "checkpoint of sparse table '{}': tensor '{}' ({}) is missing", spec_.name, name, dtype));
    return *it->second;
  };
  const auto& ids_t = tensor(prefix + "ids", "U64");
  const auto& steps_t = tensor(prefix + "steps", "U64");
  const auto& rows_t = tensor(prefix + "rows", "F32");
  const size_t n = ids_t.data.size() / sizeof(uint64_t);
  if (steps_t.data.size() != n * sizeof(uint64_t) ||
      rows_t.data.size() != n * stride_ * sizeof(float))
    throw InvalidArgumentError(fmt::format(
        "checkpoint of sparse table '{}': {} ids but tensors of other lengths", spec_.name, n));
  index_.clear();
  free_.clear();
  ids_.resize(n);
  steps_.resize(n);
  touched_.assign(n, now_s());
  arena_.resize(n * stride_);
  std::memcpy(ids_.data(), ids_t.data.data(), ids_t.data.size());
  std::memcpy(steps_.data(), steps_t.data.data(), steps_t.data.size());
  std::memcpy(arena_.data(), rows_t.data.data(), rows_t.data.size());
  for (uint32_t slot = 0; slot < n; ++slot) index_.emplace(ids_[slot], slot);
  clocks_.restore(json_integer<uint64_t>(meta.at("version")),
                  meta.at("clocks").get<std::vector<uint64_t>>());
  pending_.clear();
  for (const auto& [v, contributors] : meta.at("pending").items()) {
    Pending p;
    const auto& pi = tensor(fmt::format("{}pending{}.ids", prefix, v), "U64");
    const auto& ps = tensor(fmt::format("{}pending{}.sums", prefix, v), "F32");
    p.ids.resize(pi.data.size() / sizeof(uint64_t));
    std::memcpy(p.ids.data(), pi.data.data(), pi.data.size());
    if (ps.data.size() != p.ids.size() * spec_.width * sizeof(float))
      throw InvalidArgumentError(fmt::format(
          "checkpoint of sparse table '{}': pending sums of version {} have the wrong size",
          spec_.name, v));
    p.sums.resize(p.ids.size() * spec_.width);
    std::memcpy(p.sums.data(), ps.data.data(), ps.data.size());
    for (size_t i = 0; i < p.ids.size(); ++i) p.where.emplace(p.ids[i], i);
    p.contributors = json_integer<int>(contributors);
    pending_.emplace(std::stoull(v), std::move(p));
  }
}

}  // namespace dtrain::ps
