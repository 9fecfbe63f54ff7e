#include "common/env.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::env {

std::span<const Var> all() {
#define DTRAIN_ENV_LIST(id, name, def, help) id,
  static constexpr Var kAll[] = {DTRAIN_ENV_VARS(DTRAIN_ENV_LIST)};
#undef DTRAIN_ENV_LIST
  return kAll;
}

std::optional<std::string> raw(const Var& var) {
  const char* v = std::getenv(std::string(var.name).c_str());
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::string get_string(const Var& var) {
  auto v = raw(var);
  return v ? *v : std::string(var.default_value);
}

int64_t parse_int(std::string_view source, std::string_view text) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size())
    throw InvalidArgumentError(
        fmt::format("{} is '{}', which is not an integer: set it to a whole number", source, text));
  return value;
}

std::optional<int64_t> get_int(const Var& var) {
  std::string v = get_string(var);
  if (v.empty()) return std::nullopt;
  return parse_int(var.name, v);
}

double get_double(const Var& var) {
  std::string v = get_string(var);
  char* end = nullptr;
  double d = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size())
    throw InvalidArgumentError(
        fmt::format("{} is '{}', which is not a number: set it to a number", var.name, v));
  if (!std::isfinite(d))
    throw InvalidArgumentError(
        fmt::format("{} is '{}', which is not a finite number: set it to a number", var.name, v));
  return d;
}

bool get_bool(const Var& var) {
  std::string v = get_string(var);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v.empty() || v == "0" || v == "false" || v == "no" || v == "off") return false;
  throw InvalidArgumentError(fmt::format("{} is '{}': set it to 1 or 0", var.name, v));
}

std::chrono::milliseconds seconds(std::string_view source, double s) {
  // A year: longer than any wait means, short enough that deadlines computed from it (now +
  // timeout, in nanoseconds) cannot overflow.
  constexpr double kMax = 365.0 * 24 * 3600;
  if (!(s >= 0 && s <= kMax))
    throw InvalidArgumentError(fmt::format(
        "{} is {}: a time in seconds must be from 0 to {:g} (a year)", source, s, kMax));
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0));
}

std::chrono::milliseconds get_seconds(const Var& var) { return seconds(var.name, get_double(var)); }

}  // namespace dtrain::env
