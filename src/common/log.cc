#include "common/log.h"

#include <cctype>
#include <string>
#include <utility>

#include <spdlog/sinks/stdout_color_sinks.h>

#include "common/env.h"
#include "common/log_level.h"

namespace dtrain::log {
namespace {

std::shared_ptr<spdlog::logger> make_logger() {
  // Each Python extension module (dtrain._core, dtrain._torch) carries its own copy of this code,
  // but both use the one spdlog library and its registry: the second to log takes the first's.
  if (auto existing = spdlog::get("dtrain")) return existing;
  std::shared_ptr<spdlog::logger> logger;
  try {
    logger = spdlog::stderr_color_mt("dtrain");
  } catch (const spdlog::spdlog_ex&) {
    if (auto existing = spdlog::get("dtrain")) return existing;  // registered meanwhile
    throw;
  }
  logger->set_pattern("[%H:%M:%S.%e] [dtrain %^%l%$] %v");
  const std::string wanted = env::get_string(env::kLogLevel);
  if (auto level = parse_level(wanted)) {
    logger->set_level(*level);
  } else {
    logger->set_level(spdlog::level::info);
    logger->warn(
        "{} is '{}', which names no level: logging at info (use trace, debug, info, "
        "warn, error or off, in any case)",
        env::kLogLevel.name, wanted);
  }
  return logger;
}

}  // namespace

std::optional<spdlog::level::level_enum> parse_level(std::string_view name) {
  std::string lower;
  for (char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  using L = spdlog::level::level_enum;
  static constexpr std::pair<std::string_view, L> kNames[] = {
      {"trace", L::trace}, {"debug", L::debug},       {"info", L::info},
      {"warn", L::warn},   {"warning", L::warn},      {"error", L::err},
      {"err", L::err},     {"critical", L::critical}, {"off", L::off}};
  for (const auto& [text, level] : kNames)
    if (lower == text) return level;
  return std::nullopt;
}

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = make_logger();
  return *instance;
}

void set_rank(int rank) {
  logger().set_pattern(fmt::format("[%H:%M:%S.%e] [dtrain rank {} %^%l%$] %v", rank));
}

}  // namespace dtrain::log
