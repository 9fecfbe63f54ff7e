// DTRAIN_LOG_LEVEL's values: trace, debug, info, warn (or warning), error, critical, off, in any
// case. An unknown value leaves the level at info and says so (log.cc): it used to turn every
// line off, errors included.
#pragma once

#include <optional>
#include <string_view>

#include <spdlog/common.h>

namespace dtrain::log {

// nullopt when `name` names no level.
std::optional<spdlog::level::level_enum> parse_level(std::string_view name);

}  // namespace dtrain::log
