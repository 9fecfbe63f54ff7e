// The schedule registry, the placement of sends and receives around the compute passes, and the
// JSON form of a schedule.
#include "dtrain/pipeline/schedule.h"

#include <algorithm>
#include <mutex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/json_integer.h"
#include "dtrain/error.h"
#include "pipeline/builtin_schedules.h"

namespace dtrain::pipeline {
namespace {

constexpr std::string_view kOpNames[] = {"forward",         "backward",        "backward_input",
                                         "backward_weight", "send_activation", "recv_activation",
                                         "send_gradient",   "recv_gradient"};

struct Registry {
  std::mutex mutex;  // guards schedules
  std::vector<ScheduleInfo> schedules;
  Registry() {
    // One line per schedule file (builtin_schedules.h).
    schedules.push_back(gpipe_schedule());
    schedules.push_back(one_f_one_b_schedule());
    schedules.push_back(interleaved_1f1b_schedule());
    schedules.push_back(zb_h1_schedule());
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

// Receives go right before the pass that needs them and sends right after the pass that produced
// them. Sends never wait for their receiver, and a message that arrives before its receive is
// kept by the transport until the receive takes it, so a receive placed late costs no waiting
// on the sender's side.
Schedule with_communication(Schedule s) {
  const int last = s.stages() - 1;
  for (auto& list : s.actions) {
    std::vector<Action> out;
    out.reserve(list.size() * 2);
    for (const Action& a : list) {
      switch (a.op) {
        case Op::kForward:
          if (a.stage > 0) out.push_back({Op::kRecvActivation, a.stage, a.microbatch});
          out.push_back(a);
          if (a.stage < last) out.push_back({Op::kSendActivation, a.stage, a.microbatch});
          break;
        case Op::kBackward:
        case Op::kBackwardInput:
          if (a.stage < last) out.push_back({Op::kRecvGradient, a.stage, a.microbatch});
          out.push_back(a);
          if (a.stage > 0) out.push_back({Op::kSendGradient, a.stage, a.microbatch});
          break;
        default:
          out.push_back(a);
      }
    }
    list = std::move(out);
  }
  return s;
}

std::string_view to_string(Op op) { return kOpNames[static_cast<int>(op)]; }

bool parse_op(std::string_view text, Op* op) {
  for (size_t i = 0; i < std::size(kOpNames); ++i) {
    if (kOpNames[i] == text) {
      *op = static_cast<Op>(i);
      return true;
    }
  }
  return false;
}

std::string describe(const Action& a) {
  switch (a.op) {
    case Op::kForward:
      return fmt::format("F{} of stage {}", a.microbatch, a.stage);
    case Op::kBackward:
    case Op::kBackwardInput:
      return fmt::format("B{} of stage {}", a.microbatch, a.stage);
    case Op::kBackwardWeight:
      return fmt::format("W{} of stage {}", a.microbatch, a.stage);
    case Op::kSendActivation:
      return fmt::format("send activation {} from stage {} to stage {}", a.microbatch, a.stage,
                         a.stage + 1);
    case Op::kRecvActivation:
      return fmt::format("recv activation {} of stage {} from stage {}", a.microbatch, a.stage,
                         a.stage - 1);
    case Op::kSendGradient:
      return fmt::format("send gradient {} from stage {} to stage {}", a.microbatch, a.stage,
                         a.stage - 1);
    case Op::kRecvGradient:
      return fmt::format("recv gradient {} of stage {} from stage {}", a.microbatch, a.stage,
                         a.stage + 1);
  }
  return "?";
}

std::vector<int> Schedule::stages_of(int rank) const {
  std::vector<int> out;
  for (int s = 0; s < stages(); ++s)
    if (rank_of(s) == rank) out.push_back(s);
  return out;
}

bool Schedule::split_backward() const {
  for (const auto& list : actions)
    for (const Action& a : list)
      if (a.op == Op::kBackwardInput || a.op == Op::kBackwardWeight) return true;
  return false;
}

void register_schedule(ScheduleInfo info) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (auto& s : r.schedules) {
    if (s.name == info.name) {
      s = std::move(info);
      return;
    }
  }
  r.schedules.push_back(std::move(info));
}

std::vector<ScheduleInfo> registered_schedules() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return r.schedules;
}

Schedule make_schedule(const ScheduleOptions& o) {
  std::optional<ScheduleInfo> info;
  std::vector<std::string> names;
  for (auto& s : registered_schedules()) {
    names.push_back(s.name);
    if (s.name == o.name) info = s;
  }
  if (!info)
    throw InvalidArgumentError(fmt::format(
        "pipeline schedule '{}' is unknown; the schedules are {}", o.name, fmt::join(names, ", ")));
  if (o.ranks < 1 || o.ranks > 4096)
    throw InvalidArgumentError(
        fmt::format("pipeline schedule {}: {} ranks; give 1 to 4096", o.name, o.ranks));
  if (o.microbatches < 1 || o.microbatches > 1 << 20)
    throw InvalidArgumentError(fmt::format("pipeline schedule {}: {} micro-batches; give 1 to {}",
                                           o.name, o.microbatches, 1 << 20));
  if (o.virtual_stages < 1 || o.virtual_stages > 1024)
    throw InvalidArgumentError(fmt::format(
        "pipeline schedule {}: {} virtual stages; give 1 to 1024", o.name, o.virtual_stages));
  if (int64_t{o.ranks} * o.virtual_stages * o.microbatches > kMaxPasses)
    throw InvalidArgumentError(fmt::format(
        "pipeline schedule {}: {} stages x {} micro-batches is more than {} forward passes a step",
        o.name, o.ranks * o.virtual_stages, o.microbatches, kMaxPasses));
  if (o.virtual_stages > 1 && !info->interleaved)
    throw InvalidArgumentError(fmt::format(
        "pipeline schedule {} puts one stage on each rank; {} virtual stages need an interleaved "
        "schedule (interleaved-1f1b)",
        o.name, o.virtual_stages));
  Schedule s;
  s.name = o.name;
  s.ranks = o.ranks;
  s.virtual_stages = o.virtual_stages;
  s.microbatches = o.microbatches;
  s.actions.assign(o.ranks, {});
  info->order(s);
  return with_communication(std::move(s));
}

std::string to_json(const Schedule& s) {
  nlohmann::json j;
  j["schedule"] = s.name;
  j["ranks"] = s.ranks;
  j["virtual_stages"] = s.virtual_stages;
  j["microbatches"] = s.microbatches;
  if (!s.placement.empty()) j["placement"] = s.placement;
  auto& ranks = j["actions"] = nlohmann::json::array();
  for (const auto& list : s.actions) {
    auto row = nlohmann::json::array();
    for (const Action& a : list)
      row.push_back({{"op", to_string(a.op)}, {"stage", a.stage}, {"microbatch", a.microbatch}});
    ranks.push_back(std::move(row));
  }
  return j.dump(1);
}

Schedule schedule_from_json(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgumentError(fmt::format("pipeline schedule: not JSON ({})", e.what()));
  }
  if (!j.is_object()) throw InvalidArgumentError("pipeline schedule: the JSON is not an object");
  auto field = [&](const nlohmann::json& o, const char* key,
                   const std::string& where) -> const nlohmann::json& {
    if (!o.is_object() || !o.contains(key))
      throw InvalidArgumentError(fmt::format("pipeline schedule: {} has no '{}'", where, key));
    return o[key];
  };
  auto integer = [&](const nlohmann::json& o, const char* key, const std::string& where, int lo,
                     int hi) {
    const auto& v = field(o, key, where);
    int64_t x = 0;
    try {
      x = json_integer<int64_t>(v);
    } catch (const nlohmann::json::exception&) {
      x = int64_t{hi} + 1;  // reported below as out of range
    }
    if (x < lo || x > hi)
      throw InvalidArgumentError(
          fmt::format("pipeline schedule: {} has {} {}; give an integer "
                      "from {} to {}",
                      where, key, v.dump(), lo, hi));
    return static_cast<int>(x);
  };
  Schedule s;
  const auto& name = field(j, "schedule", "the schedule");
  s.name = name.is_string() ? name.get<std::string>() : "custom";
  s.ranks = integer(j, "ranks", "the schedule", 1, 4096);
  s.virtual_stages = integer(j, "virtual_stages", "the schedule", 1, 1024);
  s.microbatches = integer(j, "microbatches", "the schedule", 1, 1 << 20);
  if (int64_t{s.stages()} * s.microbatches > kMaxPasses)
    throw InvalidArgumentError(fmt::format(
        "pipeline schedule: {} stages x {} micro-batches is more than {} forward passes a step",
        s.stages(), s.microbatches, kMaxPasses));
  if (j.contains("placement")) {
    const auto& placement = j["placement"];
    if (!placement.is_array() || static_cast<int>(placement.size()) != s.stages())
      throw InvalidArgumentError(
          fmt::format("pipeline schedule: 'placement' must list the rank of each of the {} stages",
                      s.stages()));
    std::vector<int> held(s.ranks, 0);
    for (size_t st = 0; st < placement.size(); ++st) {
      const int r = integer(nlohmann::json{{"rank", placement[st]}}, "rank",
                            fmt::format("the placement of stage {}", st), 0, s.ranks - 1);
      s.placement.push_back(r);
      ++held[r];
    }
    for (int r = 0; r < s.ranks; ++r)
      if (held[r] != s.virtual_stages)
        throw InvalidArgumentError(
            fmt::format("pipeline schedule: the placement gives rank {} {} stages; each holds {} "
                        "(virtual_stages)",
                        r, held[r], s.virtual_stages));
  }
  const auto& ranks = field(j, "actions", "the schedule");
  if (!ranks.is_array() || static_cast<int>(ranks.size()) != s.ranks)
    throw InvalidArgumentError(fmt::format(
        "pipeline schedule: 'actions' must be a list of {} lists (one per rank)", s.ranks));
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!ranks[r].is_array())
      throw InvalidArgumentError(
          fmt::format("pipeline schedule: the actions of rank {} are not a list", r));
    std::vector<Action> list;
    for (size_t i = 0; i < ranks[r].size(); ++i) {
      const std::string where = fmt::format("action {} of rank {}", i, r);
      const auto& op = field(ranks[r][i], "op", where);
      Action a{};
      if (!op.is_string() || !parse_op(op.get<std::string>(), &a.op))
        throw InvalidArgumentError(fmt::format("pipeline schedule: {} has op {}; the ops are {}",
                                               where, op.dump(), fmt::join(kOpNames, ", ")));
      a.stage = integer(ranks[r][i], "stage", where, 0, s.stages() - 1);
      a.microbatch = integer(ranks[r][i], "microbatch", where, 0, s.microbatches - 1);
      list.push_back(a);
    }
    s.actions.push_back(std::move(list));
  }
  const bool transfers = std::any_of(s.actions.begin(), s.actions.end(), [](const auto& list) {
    return std::any_of(list.begin(), list.end(), [](const Action& a) {
      return a.op != Op::kForward && a.op != Op::kBackward && a.op != Op::kBackwardInput &&
             a.op != Op::kBackwardWeight;
    });
  });
  return transfers ? s : with_communication(std::move(s));
}

}  // namespace dtrain::pipeline
