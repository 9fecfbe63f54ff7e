#include "dtrain/live_world.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain {
namespace {

LiveMembershipOptions membership_options(const LiveWorldOptions& o) {
  return {
      .settle = o.settle, .timeout = o.timeout, .job_id = o.group.job_id, .token = o.group.token};
}

}  // namespace

LiveWorld::LiveWorld(LiveWorldOptions options)
    : options_(std::move(options)), membership_(membership_options(options_)) {
  if (membership_.too_late()) return;
  Reformed formed;
  form({.rank = membership_.rank(), .size = static_cast<int>(membership_.members().size())},
       std::chrono::steady_clock::now(), formed);
}

bool LiveWorld::peer_lost(const std::exception& e) {
  if (const auto* d = dynamic_cast<const Error*>(&e))
    return d->kind() == ErrorKind::kPeerFailure || d->kind() == ErrorKind::kAborted;
  const std::string what = e.what();
  return what.find("PeerFailureError") != std::string::npos ||
         what.find("peer failure") != std::string::npos;
}

LiveWorld::Reformed LiveWorld::reform() {
  const auto start = std::chrono::steady_clock::now();
  group_->abort("the group is being re-formed after a member's failure");
  Reformed reformed;
  LiveMembership::Next next = membership_.next();
  reformed.lost = next.lost;
  reformed.rejoined = next.rejoined;
  form(next, start, reformed);
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
  Reformed reformed;
  for (int m : missing)
    if (waiting[static_cast<size_t>(m)] != 0) reformed.joined.push_back(m);
  if (reformed.joined.empty()) return std::nullopt;
  form(membership_.admit(reformed.joined), start, reformed);
  return reformed;
}

void LiveWorld::form(LiveMembership::Next next, std::chrono::steady_clock::time_point start,
                     Reformed& formed) {
  const LiveMembership::Formed f = membership_.form(next, [&](const LiveMembership::Next& place) {
    ProcessGroupOptions o = options_.group;
    if (membership_.generation() > 0) {
      o.name = fmt::format("{}-g{}", options_.group.name, membership_.generation());
      // Its members announced themselves a moment ago: one that does not come within the
      // settle time died or stopped since (LiveMembership::form agrees again without it).
      o.connect_timeout = options_.settle;
    }
    group_ = ProcessGroup::create(membership_.store(), place.rank, place.size, o);
  });
  formed.rejoined = formed.rejoined || f.rejoined;
  formed.lost.insert(formed.lost.end(), f.lost.begin(), f.lost.end());
  std::erase_if(formed.joined,
                [&](int m) { return std::find(f.lost.begin(), f.lost.end(), m) != f.lost.end(); });
  formed.group = group_;
  formed.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace dtrain
