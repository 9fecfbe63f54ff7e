// dtrain's logger: spdlog, one line per event, tagged with this process's rank once known.
// Level from DTRAIN_LOG_LEVEL.
#pragma once

#include <spdlog/spdlog.h>

namespace dtrain::log {

spdlog::logger& logger();
// Tags every later line with "rank R" (called once the rank is known).
void set_rank(int rank);

}  // namespace dtrain::log

#define DTRAIN_LOG_TRACE(...) ::dtrain::log::logger().trace(__VA_ARGS__)
#define DTRAIN_LOG_DEBUG(...) ::dtrain::log::logger().debug(__VA_ARGS__)
#define DTRAIN_LOG_INFO(...) ::dtrain::log::logger().info(__VA_ARGS__)
#define DTRAIN_LOG_WARN(...) ::dtrain::log::logger().warn(__VA_ARGS__)
#define DTRAIN_LOG_ERROR(...) ::dtrain::log::logger().error(__VA_ARGS__)
