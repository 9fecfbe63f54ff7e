#include "dtrain/live_world.h"

#include <chrono>

#include <fmt/format.h>

namespace dtrain {
namespace {

LiveMembershipOptions membership_options(const LiveWorldOptions& o) {
  return {
      .settle = o.settle, .timeout = o.timeout, .job_id = o.group.job_id, .token = o.group.token};
}

}  // namespace

LiveWorld::LiveWorld(LiveWorldOptions options)
    : options_(std::move(options)), membership_(membership_options(options_)) {
  group_ = ProcessGroup::create(membership_.store(), membership_.rank(),
                                static_cast<int>(membership_.members().size()), options_.group);
}

LiveWorld::Reformed LiveWorld::reform() {
  const auto start = std::chrono::steady_clock::now();
  group_->abort("the group is being re-formed after a member's failure");
  LiveMembership::Next next = membership_.next();
  ProcessGroupOptions group_options = options_.group;
  group_options.name = fmt::format("{}-g{}", options_.group.name, membership_.generation());
  group_ = ProcessGroup::create(membership_.store(), next.rank, next.size, group_options);
  Reformed reformed;
  reformed.group = group_;
  reformed.lost = std::move(next.lost);
  reformed.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return reformed;
}

}  // namespace dtrain
