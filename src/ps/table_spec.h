// What a table is, as workers declare it at create time and servers record it in checkpoints:
// JSON both ways, and the one comparison that says how two declarations disagree.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "dtrain/ps.h"

namespace dtrain::ps {

struct TableSpec {
  std::string name;
  bool sparse = false;
  int num_workers = 1;
  TableOptions options;
  // dense
  uint64_t numel = 0;         // of the whole tensor
  uint64_t slice_offset = 0;  // this server's part
  uint64_t slice_length = 0;
  // sparse
  uint64_t width = 0;
  RowInit init;
  int64_t evict_after_s = 0;
};

nlohmann::json to_json(const TableSpec& spec);
// Throws InvalidArgumentError naming the field that is missing or malformed.
TableSpec spec_from_json(const nlohmann::json& j);

// "" when `b` may attach to a table declared as `a`; otherwise what differs, e.g.
// "numel 1000 here, 1024 in the existing table".
std::string spec_mismatch(const TableSpec& existing, const TableSpec& requested);

const char* to_string(Consistency c);

}  // namespace dtrain::ps
