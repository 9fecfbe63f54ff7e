#include "dtrain/live_world.h"

#include <chrono>

#include <fmt/format.h>

namespace dtrain {
namespace {

LiveMembershipOptions membership_options(const LiveWorldOptions& o) {
  return {
      .settle = o.settle, .timeout = o.timeout, .job_id = o.group.job_id, .token = o.group.token};
}

ProcessGroupOptions generation_options(const ProcessGroupOptions& o, int generation) {
  ProcessGroupOptions out = o;
  if (generation > 0) out.name = fmt::format("{}-g{}", o.name, generation);
  return out;
}

}  // namespace

LiveWorld::LiveWorld(LiveWorldOptions options)
    : options_(std::move(options)), membership_(membership_options(options_)) {
  if (membership_.too_late()) return;
  group_ = ProcessGroup::create(membership_.store(), membership_.rank(),
                                static_cast<int>(membership_.members().size()),
                                generation_options(options_.group, membership_.generation()));
}

LiveWorld::Reformed LiveWorld::reform() {
  const auto start = std::chrono::steady_clock::now();
  group_->abort("the group is being re-formed after a member's failure");
  LiveMembership::Next next = membership_.next();
  group_ = ProcessGroup::create(membership_.store(), next.rank, next.size,
                                generation_options(options_.group, membership_.generation()));
  Reformed reformed;
  reformed.group = group_;
  reformed.lost = std::move(next.lost);
  reformed.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return reformed;
}

std::optional<LiveWorld::Reformed> LiveWorld::admit_waiting() {
  const std::vector<int> missing = membership_.missing();
  if (missing.empty()) return std::nullopt;
  const auto start = std::chrono::steady_clock::now();
  std::vector<int64_t> waiting(static_cast<size_t>(membership_.size_at_start()), 0);
  if (group_->rank() == 0)
    for (int m : membership_.waiting()) waiting[static_cast<size_t>(m)] = 1;
  group_->broadcast(TensorView::of(waiting))->wait();
  std::vector<int> joiners;
  for (int m : missing)
    if (waiting[static_cast<size_t>(m)] != 0) joiners.push_back(m);
  if (joiners.empty()) return std::nullopt;
  LiveMembership::Next next = membership_.admit(joiners);
  group_ = ProcessGroup::create(membership_.store(), next.rank, next.size,
                                generation_options(options_.group, membership_.generation()));
  Reformed reformed;
  reformed.group = group_;
  reformed.joined = std::move(joiners);
  reformed.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return reformed;
}

}  // namespace dtrain
