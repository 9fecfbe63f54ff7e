#include "launch/fault_schedule.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::launch {
namespace {

constexpr const char* kAccepted =
    "a comma-separated list of kill:EVERY (SIGKILL a random worker every EVERY), "
    "stop:EVERY:FOR (SIGSTOP one for FOR), disk:EVERY:FOR (fill the file system of --fill-dir "
    "for FOR), cut:EVERY:FOR (cut a random worker's host off the network for FOR) and "
    "store:EVERY (SIGKILL the store's host), times as 30s, 500ms or 2m: --schedule "
    "kill:30s,stop:90s:5s";

std::vector<std::string> split(const std::string& text, char by) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, by);) parts.push_back(part);
  if (!text.empty() && text.back() == by) parts.emplace_back();
  return parts;
}

std::chrono::milliseconds parse_time(const std::string& text, const std::string& rule) {
  size_t end = 0;
  double value = 0;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  const std::string unit = text.substr(end);
  double ms = -1;
  if (end > 0 && std::isfinite(value) && value > 0) {
    if (unit == "ms") ms = value;
    if (unit == "s") ms = value * 1e3;
    if (unit == "m") ms = value * 60e3;
  }
  if (ms < 1 || ms > 365 * 86400e3)
    throw InvalidArgumentError(fmt::format(
        "--schedule: '{}' in '{}' is not a time: give a positive number and its unit (ms, s, m) "
        "of at least 1 ms, as in 30s; the schedule is {}",
        text, rule, kAccepted));
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(ms)));
}

}  // namespace

std::string_view fault_name(FaultKind kind) {
  switch (kind) {
    case FaultKind::kKill:
      return "kill";
    case FaultKind::kStop:
      return "stop";
    case FaultKind::kDisk:
      return "disk";
    case FaultKind::kCut:
      return "cut";
    case FaultKind::kStore:
      return "store";
  }
  return "unknown";
}

std::vector<FaultRule> parse_fault_schedule(const std::string& spec) {
  std::vector<FaultRule> rules;
  for (const std::string& rule : split(spec, ',')) {
    const std::vector<std::string> fields = split(rule, ':');
    const std::string& kind = fields.empty() ? rule : fields[0];
    FaultRule r;
    if ((kind == "kill" || kind == "store") && fields.size() == 2) {
      r = {kind == "kill" ? FaultKind::kKill : FaultKind::kStore, parse_time(fields[1], rule), {}};
    } else if ((kind == "stop" || kind == "disk" || kind == "cut") && fields.size() == 3) {
      r = {kind == "stop"   ? FaultKind::kStop
           : kind == "disk" ? FaultKind::kDisk
                            : FaultKind::kCut,
           parse_time(fields[1], rule), parse_time(fields[2], rule)};
      if (r.lasting >= r.every)
        throw InvalidArgumentError(fmt::format(
            "--schedule: '{}' lasts {} ms every {} ms: a fault must end before the next one "
            "begins",
            rule, r.lasting.count(), r.every.count()));
    } else {
      throw InvalidArgumentError(fmt::format(
          "--schedule: cannot read '{}' in '{}': the schedule is {}", rule, spec, kAccepted));
    }
    rules.push_back(r);
  }
  if (rules.empty())
    throw InvalidArgumentError(fmt::format("--schedule is empty: the schedule is {}", kAccepted));
  return rules;
}

FaultClock::FaultClock(std::vector<FaultRule> rules, uint64_t seed)
    : rules_(std::move(rules)), fired_(rules_.size(), 0), random_(seed) {}

FaultClock::Due FaultClock::next() const {
  Due due{0, std::chrono::milliseconds::max()};
  for (size_t i = 0; i < rules_.size(); ++i) {
    const auto at = rules_[i].every * (fired_[i] + 1);
    if (at < due.at) due = {i, at};
  }
  return due;
}

const FaultRule& FaultClock::fire() {
  const size_t rule = next().rule;
  ++fired_[rule];
  return rules_[rule];
}

size_t FaultClock::pick(size_t count) {
  return count <= 1 ? 0 : std::uniform_int_distribution<size_t>(0, count - 1)(random_);
}

}  // namespace dtrain::launch
