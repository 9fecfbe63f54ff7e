#include "ps/dense_table.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/json_integer.h"
#include "common/reduce.h"
#include "dtrain/error.h"
#include "ps/optimizer.h"
#include "ps/placement.h"

namespace dtrain::ps {

namespace {

template <typename T>
std::vector<std::byte> as_bytes(const T* data, size_t n) {
  std::vector<std::byte> out(n * sizeof(T));
  if (n) std::memcpy(out.data(), data, out.size());
  return out;
}

}  // namespace

DenseTable::DenseTable(TableSpec spec, std::span<const float> init)
    : spec_(std::move(spec)), state_k_(state_per_weight(spec_.options.optimizer.kind)) {
  const uint64_t n = spec_.slice_length;
  if (!init.empty() && init.size() != n)
    throw InvalidArgumentError(
        fmt::format("table '{}': {} initial values sent for a slice of {} elements", spec_.name,
                    init.size(), n));
  values_.assign(n, 0.0f);
  if (!init.empty()) std::copy(init.begin(), init.end(), values_.begin());
  state_.resize(state_k_ * n);
  uint64_t begin = 0;
  do {  // an empty slice still has one (empty) chunk to carry its clocks
    uint64_t length = std::min<uint64_t>(kChunkElems, n - begin);
    chunks_.push_back(
        Chunk{begin,
              length,
              0,
              WorkerClocks(spec_.options.consistency, spec_.options.staleness, spec_.num_workers),
              {}});
    init_state(spec_.options.optimizer, state_.data() + state_k_ * begin, length);
    begin += kChunkElems;
  } while (begin < n);
}

size_t DenseTable::chunk_index(uint64_t offset) const {
  return static_cast<size_t>((offset - spec_.slice_offset) / kChunkElems);
}

void DenseTable::check_range(uint64_t offset, uint64_t count, bool one_chunk) const {
  const uint64_t lo = spec_.slice_offset, hi = spec_.slice_offset + spec_.slice_length;
  if (spec_.slice_length > 0 && count == 0)
    throw InvalidArgumentError(
        fmt::format("table '{}': a request for 0 elements at {}", spec_.name, offset));
  if (offset < lo || offset + count > hi || offset + count < offset)
    throw InvalidArgumentError(fmt::format(
        "table '{}': elements [{}, {}) are not on this server, which holds [{}, {}) of {}",
        spec_.name, offset, offset + count, lo, hi, spec_.numel));
  if (one_chunk) {
    const uint64_t rel = offset - lo;
    const uint64_t want = std::min<uint64_t>(kChunkElems, spec_.slice_length - rel);
    if (rel % kChunkElems != 0 || count != want)
      throw InvalidArgumentError(
          fmt::format("table '{}': a push must cover one chunk of {} elements; got [{}, {})",
                      spec_.name, kChunkElems, offset, offset + count));
  }
}

void DenseTable::apply(Chunk& c, const float* grad, float scale) {
  float* w = values_.data() + c.begin;
  const auto& opt = spec_.options.optimizer;
  // kSum with sync: the table holds this step's sum of gradients, not a running total.
  if (opt.kind == OptimizerOptions::Kind::kSum && spec_.options.consistency == Consistency::kSync) {
    std::memcpy(w, grad, c.length * sizeof(float));
    ++c.steps;
    return;
  }
  apply_update(opt, w, state_.data() + state_k_ * c.begin, grad, c.length, scale, ++c.steps);
}

void DenseTable::apply_complete(Chunk& c) {
  for (;;) {
    auto it = c.pending.find(c.clocks.version());
    if (it == c.pending.end() || !c.clocks.complete(c.clocks.version())) return;
    const bool sum_only = spec_.options.optimizer.kind == OptimizerOptions::Kind::kSum;
    apply(c, it->second.sum.data(), sum_only ? 1.0f : 1.0f / it->second.contributors);
    c.pending.erase(it);
    c.clocks.on_applied();
  }
}

void DenseTable::push(int w, uint64_t offset, const float* grad) {
  Chunk& c = chunks_[chunk_index(offset)];
  const uint64_t version = c.clocks.on_push(w);
  if (spec_.options.consistency != Consistency::kSync) {
    apply(c, grad, 1.0f);
    return;
  }
  Pending& p = c.pending[version];
  if (p.contributors == 0) {
    p.sum.assign(grad, grad + c.length);
  } else {
    reduce_into(p.sum.data(), grad, c.length, DType::kF32, ReduceOp::kSum);
  }
  ++p.contributors;
  apply_complete(c);
}

std::vector<int> DenseTable::blockers(int w, uint64_t offset, uint64_t count) const {
  std::vector<int> out;
  if (spec_.slice_length == 0) return out;
  const size_t first = chunk_index(offset);
  const size_t last = chunk_index(offset + std::max<uint64_t>(count, 1) - 1);
  for (size_t i = first; i <= last; ++i)
    for (int b : chunks_[i].clocks.blockers(w))
      if (std::find(out.begin(), out.end(), b) == out.end()) out.push_back(b);
  std::sort(out.begin(), out.end());
  return out;
}

void DenseTable::read(uint64_t offset, uint64_t count, float* out) const {
  std::memcpy(out, values_.data() + (offset - spec_.slice_offset), count * sizeof(float));
}

void DenseTable::set_presence(int w, WorkerClocks::Presence p) {
  for (auto& c : chunks_) {
    c.clocks.set_presence(w, p);
    apply_complete(c);
  }
}

void DenseTable::forget(int w) {
  for (auto& c : chunks_) {
    c.clocks.set_presence(w, WorkerClocks::Presence::kLeft);
    c.pending.clear();
    c.clocks.rewind();
  }
}

std::string DenseTable::describe_clocks(uint64_t offset, uint64_t count) const {
  if (spec_.slice_length == 0) return "empty slice";
  const size_t i = chunk_index(offset);
  const size_t last = chunk_index(offset + std::max<uint64_t>(count, 1) - 1);
  const auto& c = chunks_[i];
  return fmt::format("chunk {}{}: version {}, pushes per worker {}", i,
                     last > i ? fmt::format(" (of {}-{})", i, last) : "", c.clocks.version(),
                     c.clocks.clocks());
}

nlohmann::json DenseTable::save(const std::string& prefix,
                                std::vector<SafetensorsEntry>& out) const {
  const int64_t n = static_cast<int64_t>(values_.size());
  out.push_back({prefix + "values", "F32", {n}, as_bytes(values_.data(), values_.size())});
  if (state_k_ > 0)
    out.push_back({prefix + "state",
                   "F32",
                   {static_cast<int64_t>(state_.size())},
                   as_bytes(state_.data(), state_.size())});
  nlohmann::json chunks = nlohmann::json::array();
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const auto& c = chunks_[i];
    nlohmann::json pending = nlohmann::json::object();
    for (const auto& [v, p] : c.pending) {
      std::string name = fmt::format("{}chunk{}.pending{}", prefix, i, v);
      out.push_back({name,
                     "F32",
                     {static_cast<int64_t>(p.sum.size())},
                     as_bytes(p.sum.data(), p.sum.size())});
      pending[std::to_string(v)] = p.contributors;
    }
    chunks.push_back({{"version", c.clocks.version()},
                      {"steps", c.steps},
                      {"clocks", c.clocks.clocks()},
                      {"pending", pending}});
  }
  return {{"spec", to_json(spec_)}, {"chunks", chunks}};
}

void DenseTable::restore(const nlohmann::json& meta, const std::string& prefix,
                         const std::map<std::string, const SafetensorsEntry*>& tensors) {
  auto tensor = [&](const std::string& name, size_t floats) -> const SafetensorsEntry& {
    auto it = tensors.find(name);
    if (it == tensors.end() || it->second->dtype != "F32" ||
        it->second->data.size() != floats * sizeof(float))
      throw InvalidArgumentError(fmt::format(
          "checkpoint of table '{}': tensor '{}' of {} f32 is missing or of another size",
          spec_.name, name, floats));
    return *it->second;
  };
  std::memcpy(values_.data(), tensor(prefix + "values", values_.size()).data.data(),
              values_.size() * sizeof(float));
  if (state_k_ > 0)
    std::memcpy(state_.data(), tensor(prefix + "state", state_.size()).data.data(),
                state_.size() * sizeof(float));
  const auto& chunks = meta.at("chunks");
  if (chunks.size() != chunks_.size())
    throw InvalidArgumentError(fmt::format("checkpoint of table '{}': {} chunks, expected {}",
                                           spec_.name, chunks.size(), chunks_.size()));
  for (size_t i = 0; i < chunks_.size(); ++i) {
    auto& c = chunks_[i];
    const auto& j = chunks[i];
    c.steps = json_integer<uint64_t>(j.at("steps"));
    c.clocks.restore(json_integer<uint64_t>(j.at("version")),
                     j.at("clocks").get<std::vector<uint64_t>>());
    c.pending.clear();
    for (const auto& [v, contributors] : j.at("pending").items()) {
      const auto& t = tensor(fmt::format("{}chunk{}.pending{}", prefix, i, v), c.length);
      Pending p;
      p.sum.resize(c.length);
      std::memcpy(p.sum.data(), t.data.data(), t.data.size());
      p.contributors = json_integer<int>(contributors);
      c.pending.emplace(std::stoull(v), std::move(p));
    }
  }
}

}  // namespace dtrain::ps
