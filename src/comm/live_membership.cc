#include "dtrain/live_membership.h"

#include <algorithm>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/flight_recorder.h"
#include "common/deadline.h"
#include "common/env.h"
#include "common/log.h"
#include "dtrain/error.h"
#include "dtrain/identity.h"

namespace dtrain {
namespace {

std::string here_key(int generation, int member) {
  return fmt::format("dtrain/live/g{}/here/{}", generation, member);
}
std::string members_key(int generation) {
  return fmt::format("dtrain/live/g{}/members", generation);
}

std::vector<int> parse_members(const std::string& text) {
  std::vector<int> members;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) members.push_back(std::stoi(part));
  return members;
}

}  // namespace

LiveMembership::LiveMembership(LiveMembershipOptions options) : options_(std::move(options)) {
  const Identity id = resolve_identity({});
  if (!env::get_bool(env::kAgentStore))
    throw InvalidArgumentError(
        "live recovery needs a store that outlives every worker, hosted by the launcher: run the "
        "job under `dtrain run --live`");
  TcpStoreOptions so;
  so.host = id.master_addr;
  so.port = id.master_port;
  so.rank = id.rank;
  so.job_id = options_.job_id;
  so.token = options_.token;
  so.timeout = options_.timeout;
  store_ = std::make_shared<TcpStore>(so);
  original_rank_ = id.rank;
  for (int r = 0; r < id.world_size; ++r) members_.push_back(r);
}

int LiveMembership::rank() const {
  return static_cast<int>(std::find(members_.begin(), members_.end(), original_rank_) -
                          members_.begin());
}

std::vector<int> LiveMembership::ended(std::chrono::milliseconds wait) const {
  const Deadline deadline = Deadline::after(wait);
  while (true) {
    std::vector<int> found;
    for (int m : members_)
      if (!comm::launcher_exit_word(m, std::chrono::milliseconds(0)).empty()) found.push_back(m);
    if (!found.empty() || deadline.expired()) return found;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

LiveMembership::Next LiveMembership::next() {
  const auto start = Clock::now();
  const Deadline deadline = Deadline::after(options_.timeout);
  const int next = generation_ + 1;
  store_->set(here_key(next, original_rank_), Bytes{'1'});
  // Who is here, and who the launcher says has ended; the rest may be stopped or stuck.
  const auto settle_end = start + options_.settle;
  std::vector<int> here;
  while (true) {
    here.clear();
    size_t ended = 0;
    for (int m : members_) {
      if (store_->check({here_key(next, m)}))
        here.push_back(m);
      else if (!comm::launcher_exit_word(m, std::chrono::milliseconds(0)).empty())
        ++ended;
    }
    if (here.size() + ended == members_.size() || Clock::now() >= settle_end) break;
    if (deadline.expired())
      throw TimeoutError(fmt::format(
          "rank {} (rank {} at start): re-forming generation {} of the live world took {}: of "
          "the members {}, {} announced themselves and some of the rest were neither here nor "
          "reported ended by the launcher; raise the live world's timeout "
          "(LiveWorldOptions::timeout, or timeout= in Python), or look for a stopped member",
          rank(), original_rank_, next, deadline.describe(), members_, here));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // The first survivor to close the list decides it for every one.
  const std::string proposed = fmt::format("{}", fmt::join(here, ","));
  const Bytes agreed_bytes =
      store_->compare_set(members_key(next), {}, Bytes(proposed.begin(), proposed.end()));
  const std::vector<int> agreed =
      parse_members(std::string(agreed_bytes.begin(), agreed_bytes.end()));
  const auto mine = std::find(agreed.begin(), agreed.end(), original_rank_);
  if (mine == agreed.end())
    throw AbortedError(fmt::format(
        "rank {} at start was left out of generation {} of the live world: it announced itself "
        "after the others had closed the list ({}); it cannot rejoin until a later generation "
        "takes newcomers",
        original_rank_, next, fmt::join(agreed, ", ")));
  Next result;
  for (int m : members_)
    if (std::find(agreed.begin(), agreed.end(), m) == agreed.end()) result.lost.push_back(m);
  result.rank = static_cast<int>(mine - agreed.begin());
  result.size = static_cast<int>(agreed.size());
  members_ = agreed;
  generation_ = next;
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  DTRAIN_LOG_INFO(
      "live world: generation {} agreed in {:.2f} s: {} member(s) (ranks at start {}), lost {}; "
      "this is rank {}",
      next, result.seconds, agreed.size(), fmt::join(agreed, ","), fmt::join(result.lost, ","),
      result.rank);
  return result;
}

}  // namespace dtrain
