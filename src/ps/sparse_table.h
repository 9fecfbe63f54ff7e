// A server's shard of a sparse table: rows of `width` floats keyed by 64-bit ids, created on first
// touch from the table's initializer (a function of seed and id only), each with its optimizer
// state and update count (kept with the row), dropped when untouched for evict_after. One set of
// consistency clocks for the shard. Not thread-safe: the server holds the table's lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/safetensors_file.h"
#include "ps/table_spec.h"
#include "ps/worker_clocks.h"

namespace dtrain::ps {

class SparseTable {
 public:
  explicit SparseTable(TableSpec spec);

  const TableSpec& spec() const { return spec_; }
  size_t rows() const { return index_.size(); }

  // ids are distinct (the client combines repeats); grads holds ids.size() rows.
  void push(int w, std::span<const uint64_t> ids, const float* grads);
  std::vector<int> blockers(int w) const { return clocks_.blockers(w); }
  // Creates missing rows. out holds ids.size() rows.
  void read(std::span<const uint64_t> ids, float* out);
  void set_presence(int w, WorkerClocks::Presence p);
  // As DenseTable::forget: w is gone for good, the step in progress dropped.
  void forget(int w);
  std::string describe_clocks() const;
  // Drops rows untouched since `before`; returns how many.
  size_t evict(std::chrono::steady_clock::time_point now);

  nlohmann::json save(const std::string& prefix, std::vector<SafetensorsEntry>& out) const;
  void restore(const nlohmann::json& meta, const std::string& prefix,
               const std::map<std::string, const SafetensorsEntry*>& tensors);

  // The initial values of row `id` (deterministic).
  static void init_row(const TableSpec& spec, uint64_t id, float* row);

 private:
  struct Pending {
    std::unordered_map<uint64_t, size_t> where;  // id -> row in sums
    std::vector<uint64_t> ids;
    std::vector<float> sums;
    int contributors = 0;
  };

  uint32_t slot_of(uint64_t id);  // creating the row when missing
  void apply_rows(std::span<const uint64_t> ids, const float* grads, float scale);
  void apply_complete();
  uint32_t now_s() const;

  TableSpec spec_;
  size_t state_k_;
  size_t stride_;  // floats per slot: width values, then state_k_ * width state
  std::chrono::steady_clock::time_point epoch_;
  std::unordered_map<uint64_t, uint32_t> index_;
  std::vector<float> arena_;       // stride_ per slot
  std::vector<uint64_t> ids_;      // per slot
  std::vector<uint64_t> steps_;    // per slot: updates applied (Adam's t)
  std::vector<uint32_t> touched_;  // per slot: seconds since epoch_ of the last access
  std::vector<uint32_t> free_;     // slots of evicted rows
  WorkerClocks clocks_;
  std::map<uint64_t, Pending> pending_;  // sync: version -> gradients so far
};

}  // namespace dtrain::ps
