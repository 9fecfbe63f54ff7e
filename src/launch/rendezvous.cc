#include "launch/rendezvous.h"

#include <algorithm>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "dtrain/error.h"

namespace dtrain::launch {
namespace {

using std::chrono::milliseconds;
using json = nlohmann::json;

std::string round_key(int64_t round, std::string_view what) {
  return fmt::format("round/{}/{}", round, what);
}

Bytes bytes_of(std::string_view text) { return Bytes(text.begin(), text.end()); }
std::string text_of(const Bytes& b) { return std::string(b.begin(), b.end()); }

json agent_json(const AgentInfo& a) {
  return json{{"id", a.id},     {"node", a.node}, {"host", a.host},
              {"addr", a.addr}, {"pid", a.pid},   {"nproc", a.nproc}};
}

AgentInfo agent_from(const json& j) {
  AgentInfo a;
  a.id = j.at("id").get<int64_t>();
  a.node = j.at("node").get<std::string>();
  a.host = j.at("host").get<std::string>();
  a.addr = j.at("addr").get<std::string>();
  a.pid = j.at("pid").get<int64_t>();
  a.nproc = j.at("nproc").get<int>();
  return a;
}

double seconds_of(milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

}  // namespace

std::string AgentInfo::describe() const {
  return fmt::format("node {} ({}, agent {}, pid {})", node, addr, id, pid);
}

int RoundPlan::node_rank(int64_t agent) const {
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].id == agent) return static_cast<int>(i);
  return -1;
}

int RoundPlan::world_size() const {
  int n = 0;
  for (const auto& m : members) n += m.nproc;
  return n;
}

int RoundPlan::first_rank(int node_rank) const {
  int n = 0;
  for (int i = 0; i < node_rank; ++i) n += members[static_cast<size_t>(i)].nproc;
  return n;
}

std::string RoundPlan::describe() const {
  std::vector<std::string> names;
  for (const auto& m : members) names.push_back(m.node);
  return fmt::format("{} node(s) ({}), {} worker(s)", members.size(), fmt::join(names, ", "),
                     world_size());
}

int StopCause::exit_status() const {
  if (kind != Kind::kWorkerFailed) return 1;
  if (signal != 0) return 128 + signal;
  return exit_code != 0 ? exit_code : 1;
}

std::string StopCause::to_json() const {
  return json{{"kind", static_cast<int>(kind)},
              {"counts", counts},
              {"agent", agent_json(agent)},
              {"rank", rank},
              {"exit_code", exit_code},
              {"signal", signal},
              {"stderr_tail", stderr_tail},
              {"round_seconds", round_seconds},
              {"text", text}}
      .dump();
}

StopCause StopCause::from_json(const std::string& text) {
  try {
    json j = json::parse(text);
    StopCause c;
    c.kind = static_cast<Kind>(j.at("kind").get<int>());
    c.counts = j.at("counts").get<bool>();
    c.agent = agent_from(j.at("agent"));
    c.rank = j.at("rank").get<int>();
    c.exit_code = j.at("exit_code").get<int>();
    c.signal = j.at("signal").get<int>();
    c.stderr_tail = j.at("stderr_tail").get<std::vector<std::string>>();
    c.round_seconds = j.at("round_seconds").get<double>();
    c.text = j.at("text").get<std::string>();
    return c;
  } catch (const json::exception& e) {
    throw StoreError(fmt::format(
        "elastic rendezvous: a round's stop record is not valid ({}): {:.200}; is another "
        "program using this job's keys (--rdzv-id)?",
        e.what(), text));
  }
}

void Liveness::observe(Store& store, const std::vector<int64_t>& agents) {
  if (agents.empty()) return;
  std::vector<std::string> keys;
  for (int64_t a : agents) keys.push_back(Rendezvous::heartbeat_key(a));
  std::vector<Bytes> values = store.multi_get(keys);
  auto now = Clock::now();
  for (size_t i = 0; i < agents.size(); ++i) {
    std::string v = text_of(values[i]);
    auto [it, fresh] = seen_.try_emplace(agents[i], Seen{v, now});
    if (!fresh && it->second.value != v) it->second = Seen{v, now};
  }
}

bool Liveness::alive(int64_t agent) const { return silent_for(agent) < timeout_; }

milliseconds Liveness::silent_for(int64_t agent) const {
  auto it = seen_.find(agent);
  if (it == seen_.end()) return milliseconds(0);
  return std::chrono::duration_cast<milliseconds>(Clock::now() - it->second.changed);
}

Rendezvous::Rendezvous(std::shared_ptr<Store> store, RendezvousOptions options)
    : store_(std::move(store)), options_(std::move(options)) {}

std::string Rendezvous::heartbeat_key(int64_t agent) { return fmt::format("hb/{}", agent); }

AgentInfo Rendezvous::register_agent(AgentInfo info) {
  info.id = store_->add("agents", 1);
  store_->set(fmt::format("agent/{}", info.id), agent_json(info).dump());
  store_->add(heartbeat_key(info.id), 1);
  agents_[info.id] = info;
  return info;
}

AgentInfo Rendezvous::agent_info(int64_t agent) {
  if (auto it = agents_.find(agent); it != agents_.end()) return it->second;
  std::string text = store_->get_string(fmt::format("agent/{}", agent));
  AgentInfo info;
  try {
    info = agent_from(json::parse(text));
  } catch (const json::exception& e) {
    throw StoreError(fmt::format("elastic rendezvous: agent {}'s record is not valid ({}): {:.200}",
                                 agent, e.what(), text));
  }
  agents_[agent] = info;
  return info;
}

RoundPlan Rendezvous::read_plan(int64_t round) {
  std::string text = store_->get_string(round_key(round, "plan"));
  RoundPlan plan;
  plan.round = round;
  try {
    json j = json::parse(text);
    plan.restarts = j.at("restarts").get<int64_t>();
    for (int64_t id : j.at("members").get<std::vector<int64_t>>())
      plan.members.push_back(agent_info(id));
  } catch (const json::exception& e) {
    throw StoreError(fmt::format("elastic rendezvous: round {}'s plan is not valid ({}): {:.200}",
                                 round, e.what(), text));
  }
  return plan;
}

std::string Rendezvous::job_nonce() {
  std::random_device random;
  std::string mine = fmt::format("{:08x}", random());
  return text_of(store_->compare_set("nonce", {}, bytes_of(mine)));
}

int64_t Rendezvous::open_round() { return store_->add("open", 0); }

int64_t Rendezvous::latest_closed(int64_t from) {
  int64_t r = std::max<int64_t>(from, 0);
  if (!store_->check({round_key(r, "plan")})) return from > 0 ? from - 1 : -1;
  while (store_->check({round_key(r + 1, "plan")})) ++r;
  return r;
}

int64_t Rendezvous::restarts_before(int64_t round) {
  if (round == 0) return 0;
  RoundPlan previous = read_plan(round - 1);
  auto cause = stop_cause(round - 1);
  return previous.restarts + (cause && cause->counts ? 1 : 0);
}

void Rendezvous::close(int64_t round, std::vector<int64_t> members) {
  int64_t restarts = restarts_before(round);
  if (restarts > options_.max_restarts) {
    end(fmt::format("{} failure(s), more than --max-restarts {} allows", restarts,
                    options_.max_restarts));
    return;
  }
  std::sort(members.begin(), members.end());
  if (static_cast<int>(members.size()) > options_.max_nodes)
    members.resize(static_cast<size_t>(options_.max_nodes));
  std::string plan = json{{"members", members}, {"restarts", restarts}}.dump();
  Bytes now = store_->compare_set(round_key(round, "plan"), {}, bytes_of(plan));
  if (text_of(now) != plan) return;  // another agent closed it first
  store_->add("open", 1);
  DTRAIN_LOG_DEBUG("{}: closed round {} with agents {}", options_.log_prefix, round,
                   fmt::join(members, ", "));
}

Rendezvous::Joined Rendezvous::join(const AgentInfo& me, int64_t round,
                                    const std::function<int()>& interrupted) {
  using Result = Joined::Result;
  int64_t r = std::max<int64_t>(round, 0);
  // A round that closed already cannot take this agent.
  while (store_->check({round_key(r, "plan")})) ++r;
  for (;;) {
    int64_t slot = store_->add(round_key(r, "count"), 1) - 1;
    store_->set(fmt::format("round/{}/slot/{}", r, slot), std::to_string(me.id));
    DTRAIN_LOG_DEBUG("{}: joined round {} as its arrival {}", options_.log_prefix, r, slot);

    Liveness live(options_.heartbeat_timeout);
    std::map<int64_t, int64_t> slots;  // arrival -> agent, as far as read
    bool enough = false;               // MIN agents have joined, since enough_since
    Clock::time_point enough_since{};
    std::optional<Deadline> forming;
    bool asked_to_restart = false;
    auto last_note = Clock::now();
    for (bool next_round = false; !next_round;) {
      if (int sig = interrupted ? interrupted() : 0) return {Result::kInterrupted, {}, sig};
      if (end_reason()) return {Result::kEnded, {}, 0};
      if (store_->check({round_key(r, "plan")})) {
        RoundPlan plan = read_plan(r);
        if (plan.node_rank(me.id) >= 0) return {Result::kJoined, std::move(plan), 0};
        DTRAIN_LOG_INFO(
            "{}: round {} started without this agent ({}; at most {} node(s)); it joins at the "
            "next restart",
            options_.log_prefix, r, plan.describe(), options_.max_nodes);
        ++r;
        next_round = true;
        continue;
      }
      if (r > 0) {
        if (complete(r - 1)) return {Result::kComplete, {}, 0};
        if (!store_->check({round_key(r - 1, "stop")})) {
          // The previous round still runs: watch its agents, and ask it to make room.
          RoundPlan running = read_plan(r - 1);
          std::vector<int64_t> others;
          for (const auto& m : running.members)
            if (m.id != me.id) others.push_back(m.id);
          live.observe(*store_, others);
          for (const auto& m : running.members) {
            if (m.id == me.id || live.alive(m.id)) continue;
            StopCause c;
            c.kind = StopCause::Kind::kAgentLost;
            c.agent = m;
            c.text = fmt::format("the agent of {} stopped heartbeating {:.1f} s ago", m.describe(),
                                 seconds_of(live.silent_for(m.id)));
            stop(r - 1, c);
            break;
          }
          if (!asked_to_restart && static_cast<int>(running.members.size()) < options_.max_nodes) {
            StopCause c;
            c.kind = StopCause::Kind::kNodeJoining;
            c.counts = false;
            c.agent = me;
            c.text = fmt::format("{} is waiting to join ({} of at most {} node(s) running)",
                                 me.describe(), running.members.size(), options_.max_nodes);
            StopCause recorded = stop(r - 1, c);
            asked_to_restart = true;
            if (recorded.kind == StopCause::Kind::kNodeJoining && recorded.agent.id == me.id)
              DTRAIN_LOG_INFO("{}: asked round {} ({}) to restart and take this node in",
                              options_.log_prefix, r - 1, running.describe());
          } else if (Clock::now() - last_note > std::chrono::seconds(60)) {
            DTRAIN_LOG_INFO(
                "{}: waiting to join: round {} runs with {} (--nnodes at most {}); this node joins "
                "at its next restart",
                options_.log_prefix, r - 1, running.describe(), options_.max_nodes);
            last_note = Clock::now();
          }
          std::this_thread::sleep_for(options_.poll_interval);
          continue;
        }
      }

      // The round forms: who joined, in arrival order (a slot being written shows up later).
      if (!forming) forming = Deadline::after(options_.join_timeout);
      int64_t count = store_->add(round_key(r, "count"), 0);
      for (int64_t i = 0; i < count; ++i) {
        if (slots.count(i)) continue;
        std::string key = fmt::format("round/{}/slot/{}", r, i);
        if (store_->check({key})) slots[i] = std::stoll(store_->get_string(key));
      }
      std::vector<int64_t> joined;
      for (const auto& [i, agent] : slots)
        if (std::find(joined.begin(), joined.end(), agent) == joined.end()) joined.push_back(agent);
      live.observe(*store_, joined);
      std::vector<int64_t> alive;
      for (int64_t a : joined)
        if (a == me.id || (live.alive(a) && !gone(a))) alive.push_back(a);
      const int n = static_cast<int>(alive.size());
      if (n >= options_.min_nodes && !enough) enough_since = Clock::now();
      enough = n >= options_.min_nodes;
      if (n >= options_.max_nodes ||
          (enough && Clock::now() - enough_since >= options_.last_call)) {
        close(r, alive);
        continue;  // read the plan that won at once
      }
      if (forming->expired() && !store_->check({round_key(r, "plan")}))
        throw TimeoutError(fmt::format("{}: round {} did not form within {}: {}",
                                       options_.log_prefix, r, forming->describe(),
                                       missing_report(r, alive)));
      std::this_thread::sleep_for(options_.poll_interval);
    }
  }
}

std::string Rendezvous::missing_report(int64_t round, const std::vector<int64_t>& joined) {
  std::vector<std::string> here;
  for (int64_t a : joined) here.push_back(agent_info(a).describe());
  std::string text = fmt::format("{} agent(s) joined ({}), at least {} needed (--nnodes {}:{})",
                                 joined.size(), fmt::join(here, "; "), options_.min_nodes,
                                 options_.min_nodes, options_.max_nodes);
  if (round > 0) {
    std::vector<std::string> missing;
    for (const auto& m : read_plan(round - 1).members)
      if (std::find(joined.begin(), joined.end(), m.id) == joined.end())
        missing.push_back(m.describe());
    if (!missing.empty())
      text += fmt::format("; missing from round {}: {}", round - 1, fmt::join(missing, "; "));
  }
  return text + ". Start the missing machines' `dtrain run`, or lower MIN in --nnodes MIN:MAX";
}

StopCause Rendezvous::stop(int64_t round, const StopCause& cause) {
  std::string mine = cause.to_json();
  Bytes now = store_->compare_set(round_key(round, "stop"), {}, bytes_of(mine));
  return StopCause::from_json(text_of(now));
}

std::optional<StopCause> Rendezvous::stop_cause(int64_t round) {
  std::string key = round_key(round, "stop");
  if (!store_->check({key})) return std::nullopt;
  return StopCause::from_json(store_->get_string(key));
}

StopCause Rendezvous::wait_stop_cause(int64_t round, milliseconds limit) {
  std::string key = round_key(round, "stop");
  store_->wait({key}, limit);
  return StopCause::from_json(store_->get_string(key));
}

bool Rendezvous::mark_done(const RoundPlan& plan) {
  int64_t done = store_->add(round_key(plan.round, "done"), 1);
  if (done < static_cast<int64_t>(plan.members.size())) return false;
  store_->set(round_key(plan.round, "complete"), std::string_view("1"));
  return true;
}

bool Rendezvous::complete(int64_t round) {
  return round >= 0 && store_->check({round_key(round, "complete")});
}

void Rendezvous::set_master(int64_t round, const std::string& port) {
  store_->set(round_key(round, "master"), std::string_view(port));
}

std::optional<std::string> Rendezvous::master(int64_t round) {
  std::string key = round_key(round, "master");
  if (!store_->check({key})) return std::nullopt;
  return store_->get_string(key);
}

void Rendezvous::set_resumed(int64_t round, const std::string& line) {
  store_->compare_set(round_key(round, "resumed"), {}, bytes_of(line));
}

std::optional<std::string> Rendezvous::resumed(int64_t round) {
  std::string key = round_key(round, "resumed");
  if (!store_->check({key})) return std::nullopt;
  return store_->get_string(key);
}

void Rendezvous::end(const std::string& reason) {
  store_->compare_set("end", {}, bytes_of(reason));
}

std::optional<std::string> Rendezvous::end_reason() {
  if (!store_->check({"end"})) return std::nullopt;
  return store_->get_string("end");
}

std::vector<double> Rendezvous::node_failures(const std::string& node) {
  std::string key = fmt::format("node/{}/failures", node);
  if (!store_->check({key})) return {};
  try {
    return json::parse(store_->get_string(key)).get<std::vector<double>>();
  } catch (const json::exception&) {
    return {};
  }
}

void Rendezvous::record_failure(const std::string& node, double unix_time) {
  std::string key = fmt::format("node/{}/failures", node);
  // Two agents of one machine may record at once: retry on a lost compare_set.
  for (int attempt = 0; attempt < 20; ++attempt) {
    Bytes before = store_->check({key}) ? store_->get(key) : Bytes{};
    std::vector<double> times;
    if (!before.empty()) {
      try {
        times = json::parse(text_of(before)).get<std::vector<double>>();
      } catch (const json::exception&) {
      }
    }
    times.push_back(unix_time);
    if (times.size() > 64) times.erase(times.begin());
    std::string after = json(times).dump();
    if (text_of(store_->compare_set(key, before, bytes_of(after))) == after) return;
  }
}

std::string Rendezvous::history(int64_t last) {
  std::string text;
  for (int64_t r = 0; r <= last; ++r) {
    if (!store_->check({round_key(r, "plan")})) continue;
    RoundPlan plan = read_plan(r);
    text += fmt::format("  round {}: {}", r, plan.describe());
    if (auto line = resumed(r)) text += fmt::format("; {}", *line);
    if (auto cause = stop_cause(r)) {
      text += cause->round_seconds >= 0
                  ? fmt::format("; stopped after {:.1f} s: {}", cause->round_seconds, cause->text)
                  : fmt::format("; stopped: {}", cause->text);
      text += cause->counts ? fmt::format(" [failure {}]", plan.restarts + 1)
                            : std::string(" [not counted]");
    } else if (complete(r)) {
      text += "; finished";
    }
    text += "\n";
  }
  return text;
}

bool Rendezvous::gone(int64_t agent) { return store_->check({fmt::format("gone/{}", agent)}); }

void Rendezvous::mark_gone(int64_t agent) {
  store_->set(fmt::format("gone/{}", agent), std::string_view("1"));
}

void Rendezvous::wait_for_others_gone(int64_t me, milliseconds limit) {
  auto deadline = Deadline::after(limit);
  // Only a short silence counts here: an agent that finished stops beating at once.
  Liveness live(std::min(options_.heartbeat_timeout, milliseconds(3000)));
  for (;;) {
    int64_t agents = store_->add("agents", 0);
    std::vector<int64_t> waiting;
    for (int64_t a = 1; a <= agents; ++a)
      if (a != me && !store_->check({fmt::format("gone/{}", a)})) waiting.push_back(a);
    live.observe(*store_, waiting);
    std::erase_if(waiting, [&](int64_t a) { return !live.alive(a); });
    if (waiting.empty()) return;
    if (deadline.expired()) {
      DTRAIN_LOG_WARN("{}: closing the rendezvous store after {} while agent(s) {} still use it",
                      options_.log_prefix, deadline.describe(), fmt::join(waiting, ", "));
      return;
    }
    std::this_thread::sleep_for(options_.poll_interval);
  }
}

}  // namespace dtrain::launch
