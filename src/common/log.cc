#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include "common/env.h"

namespace dtrain::log {
namespace {

std::shared_ptr<spdlog::logger> make_logger() {
  auto logger = spdlog::stderr_color_mt("dtrain");
  logger->set_pattern("[%H:%M:%S.%e] [dtrain %^%l%$] %v");
  logger->set_level(spdlog::level::from_str(env::get_string(env::kLogLevel)));
  return logger;
}

}  // namespace

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = make_logger();
  return *instance;
}

void set_rank(int rank) {
  logger().set_pattern(fmt::format("[%H:%M:%S.%e] [dtrain rank {} %^%l%$] %v", rank));
}

}  // namespace dtrain::log
