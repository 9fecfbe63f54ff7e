// What every store shares: the meaning of add and compare_set, and the words of its errors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/deadline.h"
#include "dtrain/store.h"

namespace dtrain::store {

// `"a", "b", "c" and 7 more`: keys for a message, at most `max_shown` of them.
std::string quote_keys(const std::vector<std::string>& keys, size_t max_shown = 8);
// `get("addr/5")`, `wait("a", "b")`: a call as the user wrote it.
std::string describe_call(std::string_view op, const std::vector<std::string>& keys);

// The message of a get/wait that ran out of time: who, the call, how long, which keys are missing
// and what to do about it.
std::string missing_keys_message(std::string_view who, std::string_view call,
                                 const std::vector<std::string>& keys,
                                 const std::vector<std::string>& missing, const Deadline& deadline);

// add: the value at `key` (nullptr when missing) plus delta. Values are decimal text, as in c10d,
// so that `get` of a counter reads naturally. Throws InvalidArgumentError for a value that is not
// an integer or a sum that overflows.
int64_t add_to_value(const Bytes* current, int64_t delta, const std::string& key);
Bytes integer_value(int64_t v);

// compare_set on `map` (any map from std::string to Bytes). Returns the value the key holds
// afterwards: `desired` when swapped, the current value when not, and empty when the key is
// still missing (c10d returns `expected` there, which can look like a success; we do not).
// `changed` says whether the map was modified.
template <typename Map>
Bytes compare_set_in(Map& map, const std::string& key, const Bytes& expected, const Bytes& desired,
                     bool& changed) {
  changed = false;
  auto it = map.find(key);
  if (it == map.end()) {
    if (!expected.empty()) return Bytes{};
    map.emplace(key, desired);
    changed = true;
    return desired;
  }
  if (it->second == expected) {
    it->second = desired;
    changed = true;
  }
  return it->second;
}

}  // namespace dtrain::store
