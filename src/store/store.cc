#include <charconv>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "store/store_util.h"

namespace dtrain::store {

std::string quote_keys(const std::vector<std::string>& keys, size_t max_shown) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < max_shown; ++i) {
    if (i > 0) out += ", ";
    out += fmt::format("\"{}\"", keys[i]);
  }
  if (keys.size() > max_shown) out += fmt::format(" and {} more", keys.size() - max_shown);
  return out;
}

std::string describe_call(std::string_view op, const std::vector<std::string>& keys) {
  return fmt::format("{}({})", op, quote_keys(keys, 4));
}

std::string missing_keys_message(std::string_view who, std::string_view call,
                                 const std::vector<std::string>& keys,
                                 const std::vector<std::string>& missing,
                                 const Deadline& deadline) {
  return fmt::format(
      "{}: {} timed out after {}: {} of {} key(s) still missing: {}; the processes that should "
      "set them may have died, be slower, or use another store or prefix: check their logs, or "
      "raise the timeout",
      who, call, deadline.describe(), missing.size(), keys.size(), quote_keys(missing, 16));
}

int64_t add_to_value(const Bytes* current, int64_t delta, const std::string& key) {
  int64_t value = 0;
  if (current != nullptr) {
    const char* begin = reinterpret_cast<const char*>(current->data());
    const char* end = begin + current->size();
    auto [ptr, ec] = std::from_chars(begin, end, value);
    if (current->empty() || ec != std::errc() || ptr != end)
      throw InvalidArgumentError(fmt::format(
          "add(\"{}\", {}): the key holds {} bytes that are not a decimal integer; add only to "
          "keys that hold counters",
          key, delta, current->size()));
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum))
    throw InvalidArgumentError(fmt::format("add(\"{}\", {}): {} + {} overflows a 64-bit integer",
                                           key, delta, value, delta));
  return sum;
}

Bytes integer_value(int64_t v) {
  std::string s = std::to_string(v);
  return Bytes(s.begin(), s.end());
}

}  // namespace dtrain::store
