// Integers from JSON that came from outside the process (checkpoint manifests, table specs,
// TF_CONFIG). nlohmann's get<int>() also accepts a floating-point number and converts it, which
// is undefined behaviour when it does not fit (the fuzzer found 2.2e23 as a server index). This
// takes JSON integers only, within T's range, and otherwise throws the library's own
// type_error or out_of_range, so that callers that turn JSON errors into their messages handle
// these alike.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace dtrain {

template <typename T>
T json_integer(const nlohmann::json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (std::in_range<T>(u)) return static_cast<T>(u);
  } else if (v.is_number_integer()) {
    const auto i = v.get<int64_t>();
    if (std::in_range<T>(i)) return static_cast<T>(i);
  } else {
    throw nlohmann::json::type_error::create(
        302, std::string("an integer is required, not ") + v.type_name() + " " + v.dump(), &v);
  }
  throw nlohmann::json::out_of_range::create(406, "integer " + v.dump() + " is out of range", &v);
}

// The same for the value of `key`, or `fallback` when the object has none.
template <typename T>
T json_integer(const nlohmann::json& object, const std::string& key, T fallback) {
  const auto it = object.find(key);
  return it == object.end() ? fallback : json_integer<T>(*it);
}

}  // namespace dtrain
