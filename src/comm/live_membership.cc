#include "dtrain/live_membership.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/flight_recorder.h"
#include "comm/spare_place.h"
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
// The newest generation agreed on (absent while generation 0 lasts).
const std::string kLatestKey = "dtrain/live/latest";
// Set when training is over: replacements still waiting have nothing to join.
const std::string kClosedKey = "dtrain/live/closed";
// A spare whose place waited this long for it is named late (it looks every 50 ms).
constexpr std::chrono::duration<double> kLateSpare{0.5};
// A replacement's request to be taken in, and the generation that took it in.
std::string join_key(int member) { return fmt::format("dtrain/live/join/{}", member); }
std::string joined_key(int member) { return fmt::format("dtrain/live/joined/{}", member); }
// How a member ended, in the words of its node's launcher (jobs on several nodes).
std::string ended_key(int member) { return fmt::format("dtrain/live/ended/{}", member); }

std::string text_of(const Bytes& b) { return std::string(b.begin(), b.end()); }
Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }

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
  world_size_ = id.world_size;
  several_nodes_ = env::get_int(env::kGroupWorldSize).value_or(1) > 1;
  replacement_ = env::get_bool(env::kLiveReplacement);
  spare_ = env::get_int(env::kLiveSpare).value_or(0);
  if (spare_ > 0 && !replacement_)
    throw InvalidArgumentError(fmt::format(
        "DTRAIN_LIVE_SPARE is {} but DTRAIN_LIVE_REPLACEMENT is not set: a spare joins as a "
        "replacement; start spares with `dtrain run --live --spares K`",
        spare_));
  if (replacement_) {
    if (spare_ > 0 && !take_place()) return;
    join();
    return;
  }
  for (int r = 0; r < id.world_size; ++r) members_.push_back(r);
}

void LiveMembership::join() {
  const auto start = Clock::now();
  const Deadline deadline = Deadline::after(options_.timeout);
  const std::string who = spare_ > 0     ? fmt::format("spare {}", spare_)
                          : replacement_ ? "a replacement"
                                         : "left out of a generation";
  auto expired = [&](const char* waiting_for) {
    if (!deadline.expired()) return;
    throw TimeoutError(fmt::format(
        "rank {} at start, {}: {} took {}; the live workers look for newcomers at each step "
        "boundary: raise the live world's timeout (LiveWorldOptions::timeout), or look for a "
        "stuck worker",
        original_rank_, who, waiting_for, deadline.describe()));
  };
  // Until the members have left the predecessor out, the launcher's word on it tells them it
  // ended; after, it must not be taken for this process's. (A survivor left out has none.)
  while (true) {
    if (store_->check({kClosedKey})) {
      too_late_ = true;
      return;
    }
    if (store_->check({kLatestKey})) {
      const int latest = std::stoi(text_of(store_->get(kLatestKey)));
      const auto members = parse_members(text_of(store_->get(members_key(latest))));
      if (std::find(members.begin(), members.end(), original_rank_) == members.end()) break;
    }
    expired("waiting for the live workers to leave its predecessor out");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  comm::forget_launcher_exit_word(original_rank_);
  if (several_nodes_) store_->delete_key(ended_key(original_rank_));
  store_->set(join_key(original_rank_), Bytes{'1'});
  while (!store_->check({joined_key(original_rank_)})) {
    if (store_->check({kClosedKey})) {
      store_->delete_key(join_key(original_rank_));
      too_late_ = true;
      return;
    }
    expired("waiting to be taken in");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  generation_ = std::stoi(text_of(store_->get(joined_key(original_rank_))));
  store_->delete_key(joined_key(original_rank_));
  members_ = parse_members(text_of(store_->get(members_key(generation_))));
  DTRAIN_LOG_INFO(
      "live world: rank {} at start, {}, taken in by generation {} after {:.2f} s: {} member(s) "
      "(ranks at start {}); this is rank {}",
      original_rank_, who, generation_, std::chrono::duration<double>(Clock::now() - start).count(),
      members_.size(), fmt::join(members_, ","), rank());
}

bool LiveMembership::take_place() {
  const auto start = Clock::now();
  const std::string dir = env::get_string(env::kFlightDir);
  if (dir.empty())
    throw InvalidArgumentError(fmt::format(
        "spare {}: DTRAIN_FLIGHT_DIR is not set, so its launcher cannot give it a place: start "
        "spares with `dtrain run --live --spares K`",
        spare_));
  // A spare may wait the whole job, beside the ranks training: it looks for its place every
  // 50 ms (a file of its node's launcher; the members re-form meanwhile) and asks the store
  // whether training ended every 250 ms. Should the launcher die, its workers die with it.
  auto next_look = start;
  while (true) {
    if (const auto place = comm::read_spare_place(dir, spare_)) {
      original_rank_ = place->rank;
      ::setenv(std::string(env::kRank.name).c_str(), std::to_string(place->rank).c_str(), 1);
      ::setenv(std::string(env::kLocalRank.name).c_str(), std::to_string(place->local_rank).c_str(),
               1);
      const double waited = std::chrono::duration<double>(Clock::now() - start).count();
      // A place given before the spare began to wait waited for the spare instead: the others
      // trained short-handed meanwhile.
      const double late =
          std::chrono::duration<double>(std::chrono::system_clock::now() - place->given).count() -
          waited;
      if (late >= kLateSpare.count())
        DTRAIN_LOG_WARN(
            "live world: spare {} takes the place of rank {} at start {:.1f} s after its launcher "
            "gave it: the spare was still getting ready (its program's start up to its first "
            "need of the world) when a worker died, and the others trained without that rank "
            "meanwhile. Spares get ready at the idle CPU priority, on cycles the workers leave; "
            "where the workers keep every CPU busy there are none: leave a CPU to the spares, or "
            "for a Python program have them forked from a process that imported its modules "
            "(dtrain run --preload torch)",
            spare_, original_rank_, late);
      else
        DTRAIN_LOG_INFO("live world: spare {} takes the place of rank {} at start after {:.2f} s",
                        spare_, original_rank_, waited);
      return true;
    }
    if (Clock::now() >= next_look) {
      if (store_->check({kClosedKey})) {
        too_late_ = true;
        return false;
      }
      next_look = Clock::now() + std::chrono::milliseconds(250);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::vector<int> LiveMembership::missing() const {
  std::vector<int> out;
  for (int r = 0; r < world_size_; ++r)
    if (std::find(members_.begin(), members_.end(), r) == members_.end()) out.push_back(r);
  return out;
}

std::vector<int> LiveMembership::waiting() {
  // Called at every step boundary while a rank is missing: the store is asked less often.
  const auto now = std::chrono::steady_clock::now();
  if (now < next_look_) return {};
  next_look_ = now + std::chrono::milliseconds(100);
  std::vector<int> out;
  for (int m : missing())
    if (store_->check({join_key(m)})) out.push_back(m);
  return out;
}

void LiveMembership::close() { store_->set(kClosedKey, Bytes{'1'}); }

LiveMembership::Next LiveMembership::admit(const std::vector<int>& joiners) {
  const auto start = Clock::now();
  const int next = generation_ + 1;
  std::vector<int> proposed = members_;
  proposed.insert(proposed.end(), joiners.begin(), joiners.end());
  std::sort(proposed.begin(), proposed.end());
  const std::string text = fmt::format("{}", fmt::join(proposed, ","));
  const std::string agreed = text_of(store_->compare_set(members_key(next), {}, bytes_of(text)));
  if (agreed != text)
    throw AbortedError(fmt::format(
        "rank {} (rank {} at start): taking in rank(s) {} at start as generation {} of the live "
        "world failed: a re-forming after a failure formed it first (members {})",
        rank(), original_rank_, fmt::join(joiners, ", "), next, agreed));
  if (rank() == 0) {
    for (int j : joiners) {
      store_->delete_key(join_key(j));
      store_->set(joined_key(j), bytes_of(std::to_string(next)));
    }
  }
  store_->set(kLatestKey, bytes_of(std::to_string(next)));
  members_ = std::move(proposed);
  generation_ = next;
  Next result;
  result.rank = rank();
  result.size = static_cast<int>(members_.size());
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  DTRAIN_LOG_INFO(
      "live world: generation {} takes in rank(s) {} at start: {} member(s) (ranks at "
      "start {}); this is rank {}",
      next, fmt::join(joiners, ","), members_.size(), fmt::join(members_, ","), result.rank);
  return result;
}

LiveMembership::Next LiveMembership::rejoin(int generation, const std::vector<int>& agreed,
                                            Clock::time_point start) {
  DTRAIN_LOG_WARN(
      "live world: rank {} at start was left out of generation {}: it announced itself after the "
      "others had closed the list (ranks at start {}); its state is stale: it asks to be taken in "
      "again and takes the members' state",
      original_rank_, generation, fmt::join(agreed, ","));
  join();
  if (too_late_)
    throw AbortedError(fmt::format(
        "rank {} at start was left out of generation {} of the live world (it announced itself "
        "after the others had closed the list) and training ended before they took it in again: "
        "nothing is left for it to do",
        original_rank_, generation));
  Next result;
  result.rank = rank();
  result.size = static_cast<int>(members_.size());
  result.rejoined = true;
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

LiveMembership::Formed LiveMembership::form(Next place,
                                            const std::function<void(const Next&)>& make) {
  Formed formed;
  while (true) {
    try {
      make(place);
      formed.place = place;
      return formed;
    } catch (const std::exception& e) {
      if (generation_ == 0) throw;  // the job's start: its own connect timeout says it
      DTRAIN_LOG_WARN(
          "live world: generation {}'s group did not form: {}; agreeing again without whoever "
          "did not come",
          generation_, e.what());
      const std::exception_ptr failed = std::current_exception();
      place = next();
      if (place.lost.empty() && !place.rejoined) std::rethrow_exception(failed);
      formed.lost.insert(formed.lost.end(), place.lost.begin(), place.lost.end());
      formed.rejoined = formed.rejoined || place.rejoined;
    }
  }
}

int LiveMembership::rank() const {
  return static_cast<int>(std::find(members_.begin(), members_.end(), original_rank_) -
                          members_.begin());
}

bool LiveMembership::reported_ended(int m) const {
  if (!comm::launcher_exit_word(m, std::chrono::milliseconds(0)).empty()) return true;
  return several_nodes_ && store_->check({ended_key(m)});
}

void LiveMembership::publish_ended(Store& store, int rank, const std::string& how) {
  store.set(ended_key(rank), bytes_of(how));
}

std::vector<int> LiveMembership::ended(std::chrono::milliseconds wait) const {
  const Deadline deadline = Deadline::after(wait);
  while (true) {
    std::vector<int> found;
    for (int m : members_)
      if (reported_ended(m)) found.push_back(m);
    if (!found.empty() || deadline.expired()) return found;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

LiveMembership::Next LiveMembership::next() {
  try {
    return agree_next();
  } catch (const StoreError& e) {
    // The store's host died (or is cut off from this one): whoever is left cannot agree.
    throw StoreError(fmt::format(
        "rank {} (rank {} at start): re-forming generation {} of the live world: the job's "
        "store, which node 0's launcher hosts, cannot be reached ({}). Without it this rank "
        "cannot agree with the others, so it stops. If only this host is cut off, the others go "
        "on without it (dtrain run --replace starts a replacement here once the store answers "
        "again); if the store's host died, no one can go on: what was saved is intact, start "
        "the job again to resume from its last checkpoint",
        rank(), original_rank_, generation_ + 1, e.what()));
  }
}

LiveMembership::Next LiveMembership::agree_next() {
  const auto start = Clock::now();
  const Deadline deadline = Deadline::after(options_.timeout);
  const int next = generation_ + 1;
  store_->set(here_key(next, original_rank_), Bytes{'1'});
  // Who is here, and who the launcher says has ended; the rest may be stopped or stuck.
  const auto settle_end = start + options_.settle;
  std::vector<int> here;
  std::vector<int> silent;  // neither here nor reported ended
  while (true) {
    here.clear();
    silent.clear();
    for (int m : members_) {
      if (store_->check({here_key(next, m)}))
        here.push_back(m);
      else if (!reported_ended(m))
        silent.push_back(m);
    }
    if (silent.empty()) break;
    // Another survivor closed the list already (and a replacement may have taken the launcher's
    // word on its predecessor since): it is decided.
    if (store_->check({members_key(next)})) break;
    if (Clock::now() >= settle_end) {
      // On several nodes the silent members may be cut off rather than stopped: this side goes
      // on only as a majority of the members not reported ended.
      if (several_nodes_ && here.size() <= silent.size())
        throw AbortedError(fmt::format(
            "rank {} (rank {} at start): re-forming generation {} of the live world: rank(s) at "
            "start {} neither announced themselves within {:.1f} s nor were reported ended by "
            "their launcher: they may be cut off from this side by a network partition. Only {} "
            "of the {} members not reported ended are here, not a majority: this side stops "
            "rather than train on alone (no split brain). Restart the job from its last "
            "checkpoint once the network is whole (or raise the live world's settle time if "
            "they were only slow)",
            rank(), original_rank_, next, silent,
            std::chrono::duration<double>(options_.settle).count(), here.size(),
            here.size() + silent.size()));
      break;
    }
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
  if (mine == agreed.end()) return rejoin(next, agreed, start);
  store_->set(kLatestKey, bytes_of(std::to_string(next)));
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
