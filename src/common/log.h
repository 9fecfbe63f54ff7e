// dtrain's logger: spdlog, one line per event, tagged with this process's rank once known.
// Level from DTRAIN_LOG_LEVEL.
#pragma once

#include <spdlog/spdlog.h>

namespace dtrain::log {

spdlog::logger& logger();
// Tags every later line with "rank R" (called once the rank is known).
void set_rank(int rank);

}  // namespace dtrain::log

// Trace and debug arguments are evaluated only when the level is on: hot paths log at debug.
#define DTRAIN_LOG_AT_(level, ...)                                                \
  do {                                                                            \
    auto& dtrain_logger_ = ::dtrain::log::logger();                               \
    if (dtrain_logger_.should_log(level)) dtrain_logger_.log(level, __VA_ARGS__); \
  } while (0)
#define DTRAIN_LOG_TRACE(...) DTRAIN_LOG_AT_(spdlog::level::trace, __VA_ARGS__)
#define DTRAIN_LOG_DEBUG(...) DTRAIN_LOG_AT_(spdlog::level::debug, __VA_ARGS__)
#define DTRAIN_LOG_INFO(...) ::dtrain::log::logger().info(__VA_ARGS__)
#define DTRAIN_LOG_WARN(...) ::dtrain::log::logger().warn(__VA_ARGS__)
#define DTRAIN_LOG_ERROR(...) ::dtrain::log::logger().error(__VA_ARGS__)
