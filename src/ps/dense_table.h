// A server's slice of a dense table: the values, the optimizer's state, and per chunk (placement.h)
// the consistency clocks and, for synchronous tables, the sums of gradients still waiting for
// other workers. Not thread-safe: the server holds the table's lock around every call.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/safetensors_file.h"
#include "ps/table_spec.h"
#include "ps/worker_clocks.h"

namespace dtrain::ps {

class DenseTable {
 public:
  // `init` holds the slice's initial values (empty: zeros).
  DenseTable(TableSpec spec, std::span<const float> init);

  const TableSpec& spec() const { return spec_; }

  // Throws InvalidArgumentError unless [offset, offset + count) lies in this slice and, for a push,
  // is exactly one chunk.
  void check_range(uint64_t offset, uint64_t count, bool one_chunk) const;

  // Records worker w's gradient for one chunk: applied now (async, SSP) or summed until every
  // worker's push of that version arrived, then averaged and applied once (sync).
  void push(int w, uint64_t offset, const float* grad);
  // The workers that w's read of the range waits for (empty: read now).
  std::vector<int> blockers(int w, uint64_t offset, uint64_t count) const;
  void read(uint64_t offset, uint64_t count, float* out) const;
  // A worker left or failed; pending versions that no longer wait for it are applied.
  void set_presence(int w, WorkerClocks::Presence p);
  // Worker w is gone for good and the step in progress is dropped (sync: its pending sums
  // cleared, every clock rewound to the version), for the others to push again.
  void forget(int w);
  // "chunk 3: version 17, clocks [18, 17, 16]" for error messages.
  std::string describe_clocks(uint64_t offset, uint64_t count) const;

  // Checkpoints: tensors named <prefix>values, <prefix>state, <prefix>chunk<i>.pending<v>, and
  // the clocks and versions in the returned JSON.
  nlohmann::json save(const std::string& prefix, std::vector<SafetensorsEntry>& out) const;
  void restore(const nlohmann::json& meta, const std::string& prefix,
               const std::map<std::string, const SafetensorsEntry*>& tensors);

 private:
  struct Pending {
    std::vector<float> sum;
    int contributors = 0;
  };
  struct Chunk {
    uint64_t begin = 0;  // within the slice
    uint64_t length = 0;
    uint64_t steps = 0;  // updates applied (Adam's t)
    WorkerClocks clocks;
    std::map<uint64_t, Pending> pending;  // sync: version -> gradients so far
  };

  void apply(Chunk& c, const float* grad, float scale);
  void apply_complete(Chunk& c);
  size_t chunk_index(uint64_t offset) const;

  TableSpec spec_;
  size_t state_k_;
  std::vector<float> values_;  // slice_length
  std::vector<float> state_;   // per chunk planar: state_k_ * chunk length, chunk after chunk
  std::vector<Chunk> chunks_;
};

}  // namespace dtrain::ps
