// Launcher values from the environment (identity.h): arbitrary NAME=VALUE lines as the only
// environment resolve a process's identity, or throw InvalidArgumentError naming a variable;
// Slurm host lists expand or are refused.
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "dtrain/error.h"
#include "dtrain/identity.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return -1;
  std::map<std::string, std::string, std::less<>> env;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  while (!text.empty()) {
    const size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    const size_t eq = line.find('=');
    if (eq != std::string_view::npos) env[std::string(line.substr(0, eq))] = line.substr(eq + 1);
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  dtrain::EnvLookup lookup = [&](std::string_view name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  try {
    dtrain::resolve_identity({}, lookup);
  } catch (const dtrain::Error&) {
  }
  for (const auto& [name, value] : env) {
    try {
      dtrain::expand_slurm_nodelist(value);
    } catch (const dtrain::Error&) {
    }
  }
  return 0;
}
