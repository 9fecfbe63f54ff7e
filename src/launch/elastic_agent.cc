#include "launch/elastic_agent.h"

#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>

#include <fmt/format.h>

#include "common/env.h"
#include "common/log.h"
#include "common/socket.h"
#include "dtrain/error.h"
#include "dtrain/store.h"
#include "launch/cpu_binding.h"
#include "launch/flight_dir.h"
#include "launch/hang_monitor.h"
#include "launch/heartbeat.h"
#include "launch/progress_file.h"
#include "launch/rendezvous.h"
#include "launch/supervisor.h"

namespace dtrain::launch {
namespace {

using std::chrono::milliseconds;
using Kind = StopCause::Kind;

// How often an agent looks at the store while its workers run: the delay between a failure on
// one machine and the workers of the others being told to stop.
constexpr milliseconds kWatchInterval{100};
// Limit of one store call; the waits of the protocol poll with their own deadlines.
constexpr milliseconds kStoreCallTimeout{30'000};
// For node 0 to publish the round's workers' store.
constexpr milliseconds kMasterTimeout{60'000};
// For the agent hosting the store to let the others read their last keys.
constexpr milliseconds kLingerTimeout{10'000};
constexpr size_t kCauseTailLines = 3;
constexpr size_t kCauseLineChars = 300;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "localhost";
  return host;
}

// Whether `host` names an address of this machine: binding to it (any port) works.
bool is_local_address(const std::string& host) {
  if (host.empty() || host == "0.0.0.0" || host == "::") return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (::getaddrinfo(host.c_str(), "0", &hints, &list) != 0) return false;
  bool local = false;
  for (addrinfo* a = list; a != nullptr && !local; a = a->ai_next) {
    net::Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    local = fd.valid() && ::bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0;
  }
  ::freeaddrinfo(list);
  return local;
}

void say(const std::string& line) {
  std::string text = line + "\n";
  // One write per line, so that the lines of several agents on one terminal stay whole.
  [[maybe_unused]] ssize_t n = ::write(2, text.data(), text.size());
}

// The last lines of a worker's stderr, in one line.
std::string tail_in_one_line(const std::vector<std::string>& tail) {
  if (tail.empty()) return "it wrote nothing to stderr";
  std::string text = "last stderr: ";
  size_t from = tail.size() > kCauseTailLines ? tail.size() - kCauseTailLines : 0;
  for (size_t i = from; i < tail.size(); ++i) {
    std::string line = tail[i].substr(0, kCauseLineChars);
    text += fmt::format("{}\"{}\"", i == from ? "" : " | ", line);
  }
  return text;
}

// The workers' in-memory commit directory (DTRAIN_COMMIT_DIR): on tmpfs, owned by the agent, so
// that the commits of a worker that dies outlive it and its restarted successor finds them. The
// agent's pid is part of the name (two jobs with the default --rdzv-id on one machine must not
// share it); a directory of the same job and node whose agent is gone (killed with SIGKILL) is
// removed at start. Removed with everything in it when the agent exits.
class CommitDir {
 public:
  static constexpr const char* kRoot = "/dev/shm";

  CommitDir(const std::string& run_id, const std::string& node, const std::string& log_prefix) {
    const std::string prefix = fmt::format("dtrain-commit-{}-{}-", safe(run_id), safe(node));
    remove_stale(prefix, log_prefix);
    const std::string path = fmt::format("{}/{}{}", kRoot, prefix, ::getpid());
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (::mkdir(path.c_str(), 0700) != 0) {
      say(
          fmt::format("{}: no in-memory commits: cannot create {}: {}; the workers resume from "
                      "their disk checkpoints only",
                      log_prefix, path, std::strerror(errno)));
      return;
    }
    path_ = path;
    DTRAIN_LOG_INFO("{}: in-memory commits in {} (DTRAIN_COMMIT_DIR)", log_prefix, path_);
  }
  ~CommitDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    if (ec) DTRAIN_LOG_WARN("dtrain run: cannot remove {}: {}", path_, ec.message());
  }
  CommitDir(const CommitDir&) = delete;
  CommitDir& operator=(const CommitDir&) = delete;

  const std::string& path() const { return path_; }  // "" when it could not be made

 private:
  static std::string safe(const std::string& name) {
    std::string out = name;
    for (char& c : out)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_') c = '_';
    return out;
  }

  static void remove_stale(const std::string& prefix, const std::string& log_prefix) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(kRoot, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(prefix, 0) != 0) continue;
      const std::string pid = name.substr(prefix.size());
      if (pid.empty() || pid.size() > 9 ||
          !std::all_of(pid.begin(), pid.end(), [](char c) { return c >= '0' && c <= '9'; }))
        continue;
      if (::kill(static_cast<pid_t>(std::stol(pid)), 0) == 0 || errno != ESRCH) continue;
      std::error_code rm;
      std::filesystem::remove_all(e.path(), rm);
      DTRAIN_LOG_INFO("{}: removed {}, left by an agent of this job and node that is gone{}",
                      log_prefix, e.path().string(), rm ? ": " + rm.message() : "");
    }
  }

  std::string path_;
};

// A TcpStore client of the rendezvous store, under the job's prefix.
struct StoreLink {
  std::shared_ptr<TcpStore> tcp;
  std::shared_ptr<Store> store;
};

// Watches one round for the agent while its workers run: the round's stop record, its
// completion, and the other agents' heartbeats. fd() becomes readable when the round is over.
// Watches the round's store (the workers') for the first worker's announcement of where it
// resumed from (dtrain::announce_resumed) and hands it to `said`, at once (the store wakes the
// waiting call). The watching thread is detached: a round that ends does not wait for it, and
// `said` is never called once the watch is destroyed.
class ResumeWatch {
 public:
  ResumeWatch(std::string host, uint16_t port, std::string job_id,
              std::function<void(std::string)> said)
      : state_(std::make_shared<State>()) {
    state_->said = std::move(said);
    std::thread([state = state_, host = std::move(host), port, job_id = std::move(job_id)] {
      constexpr milliseconds kSlice{50};  // how soon a closed watch's thread notices
      std::unique_ptr<TcpStore> store;
      for (;;) {
        {
          std::lock_guard lock(state->mu);
          if (!state->open) return;
        }
        try {
          if (!store) {
            TcpStoreOptions o;
            o.host = host;
            o.port = port;
            o.job_id = job_id;
            o.timeout = kStoreCallTimeout;
            o.connect_timeout = std::chrono::seconds(5);
            store = std::make_unique<TcpStore>(o);
          }
          store->wait({launch::kResumedKey}, kSlice);
          const Bytes line = store->get(launch::kResumedKey);
          std::lock_guard lock(state->mu);
          if (state->open) state->said(std::string(line.begin(), line.end()));
          return;
        } catch (const TimeoutError&) {
          // Not yet.
        } catch (const Error& e) {
          // The round's store is not up yet, or has closed with the round.
          DTRAIN_LOG_DEBUG("watching {}:{} for a resumption: {}", host, port, e.what());
          store.reset();
          std::this_thread::sleep_for(kSlice);
        }
      }
    }).detach();
  }
  ~ResumeWatch() {
    std::lock_guard lock(state_->mu);
    state_->open = false;
  }
  ResumeWatch(const ResumeWatch&) = delete;
  ResumeWatch& operator=(const ResumeWatch&) = delete;

 private:
  struct State {
    std::mutex mu;  // guards open; held while `said` runs
    bool open = true;
    std::function<void(std::string)> said;
  };
  std::shared_ptr<State> state_;
};

class RoundWatch {
 public:
  enum class Event { kNone, kComplete, kStopped, kStoreLost };

  RoundWatch(std::shared_ptr<Store> store, const RoundPlan& plan, const AgentInfo& me,
             const RendezvousOptions& options, Clock::time_point started)
      : wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (!wake_.valid())
      throw InternalError(fmt::format("dtrain run: eventfd failed: {}", std::strerror(errno)));
    thread_ = std::jthread(
        [this, store = std::move(store), plan, me, options, started](std::stop_token stop) {
          watch(stop, Rendezvous(store, options), plan, me, started);
        });
  }
  ~RoundWatch() {
    thread_.request_stop();
    cv_.notify_all();
  }
  RoundWatch(const RoundWatch&) = delete;
  RoundWatch& operator=(const RoundWatch&) = delete;

  int fd() const { return wake_.get(); }
  Event event() const {
    std::lock_guard lock(mutex_);
    return event_;
  }
  Clock::time_point when() const {
    std::lock_guard lock(mutex_);
    return when_;
  }
  std::string error() const {
    std::lock_guard lock(mutex_);
    return error_;
  }

 private:
  void watch(std::stop_token stop, Rendezvous rdzv, const RoundPlan& plan, const AgentInfo& me,
             Clock::time_point started) {
    Liveness live(rdzv.options().heartbeat_timeout);
    std::vector<int64_t> others;
    for (const auto& m : plan.members)
      if (m.id != me.id) others.push_back(m.id);
    try {
      while (!stop.stop_requested()) {
        if (rdzv.complete(plan.round)) return fire(Event::kComplete, "");
        if (rdzv.stop_cause(plan.round)) return fire(Event::kStopped, "");
        live.observe(rdzv.store(), others);
        for (const auto& m : plan.members) {
          if (m.id == me.id || live.alive(m.id)) continue;
          StopCause c;
          c.kind = Kind::kAgentLost;
          c.agent = m;
          c.round_seconds = seconds_between(started, Clock::now());
          c.text = fmt::format("the agent of {} stopped heartbeating {:.1f} s ago", m.describe(),
                               live.silent_for(m.id).count() / 1000.0);
          rdzv.stop(plan.round, c);
          break;
        }
        std::unique_lock lock(mutex_);
        cv_.wait_for(lock, stop, kWatchInterval, [] { return false; });
      }
    } catch (const Error& e) {
      fire(Event::kStoreLost, e.what());
    }
  }

  void fire(Event event, const std::string& error) {
    {
      std::lock_guard lock(mutex_);
      event_ = event;
      when_ = Clock::now();
      error_ = error;
    }
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
  }

  net::Fd wake_;
  mutable std::mutex mutex_;  // guards event_, when_, error_; cv_ waits on it
  std::condition_variable_any cv_;
  Event event_ = Event::kNone;
  Clock::time_point when_{};
  std::string error_;
  std::jthread thread_;  // last: joined before the members above go
};

class Agent {
 public:
  Agent(const ElasticOptions& options, Supervisor& supervisor)
      : options_(options), supervisor_(supervisor) {
    node_ = options.node_name.empty() ? host_name() : options.node_name;
    prefix_ = fmt::format("dtrain run [node {}]", node_);
    rdzv_options_.min_nodes = options.min_nodes;
    rdzv_options_.max_nodes = options.max_nodes;
    rdzv_options_.max_restarts = options.max_restarts;
    rdzv_options_.join_timeout = options.join_timeout;
    rdzv_options_.last_call = options.last_call;
    rdzv_options_.heartbeat_timeout = options.heartbeat_timeout;
    rdzv_options_.log_prefix = prefix_;
    commit_dir_ = std::make_unique<CommitDir>(options.run_id, node_, prefix_);
  }

  ~Agent() {
    if (heartbeat_) heartbeat_->stop();
  }

  int run() {
    connect();
    start_heartbeat();
    int64_t round = 0;
    try {
      round = rdzv_->open_round();
      return run_rounds(round);
    } catch (const StoreError& e) {
      if (server_) throw;  // this agent's own store: it cannot have lost it
      if (heartbeat_) heartbeat_->stop();
      // Whichever call found it gone (the round's watch, the record of a failure): one word.
      throw StoreError(fmt::format(
          "{}: lost the rendezvous store at {} during round {}: {}. The agent hosting it has "
          "exited or its machine is unreachable; the job cannot go on without it. The workers' "
          "checkpoints on disk are kept: start the job again to resume from the newest",
          prefix_, endpoint_, round, e.what()));
    }
  }

 private:
  // The rounds of the job from `round` on, until it ends; updates `round` as they go.
  int run_rounds(int64_t& round) {
    for (;;) {
      if (auto code = sit_out_if_excluded()) return finish(*code, /*linger=*/true);
      auto joined = rdzv_->join(me_, round, [this] { return supervisor_.take_signal(); });
      using Result = Rendezvous::Joined::Result;
      if (joined.result == Result::kComplete) {
        say(fmt::format("{}: the job finished while this agent waited to join", prefix_));
        return finish(0, /*linger=*/true);
      }
      if (joined.result == Result::kEnded) return finish(report_end(round), /*linger=*/true);
      if (joined.result == Result::kInterrupted) {
        say(fmt::format("{}: got {} while waiting to join; leaving the job", prefix_,
                        signal_name(joined.signal)));
        return finish(128 + joined.signal, /*linger=*/false);
      }
      const RoundPlan& plan = joined.plan;
      auto outcome = run_round(plan);
      if (outcome.signal != 0 || outcome.requeue)
        return finish(outcome.exit_code, /*linger=*/false);
      if (!outcome.cause) {
        DTRAIN_LOG_INFO("{}: round {} finished: all {} worker(s) succeeded", prefix_, plan.round,
                        plan.world_size());
        flight_.remove_if_unused();
        return finish(0, /*linger=*/true);
      }
      const StopCause& cause = *outcome.cause;
      if (cause.kind == Kind::kWorkerFailed && cause.agent.id == me_.id)
        rdzv_->record_failure(node_, unix_now());
      int64_t restarts = plan.restarts + (cause.counts ? 1 : 0);
      std::string line =
          cause.round_seconds >= 0
              ? fmt::format("{}: round {} stopped after {:.1f} s: {}", prefix_, plan.round,
                            cause.round_seconds, cause.text)
              : fmt::format("{}: round {} stopped: {}", prefix_, plan.round, cause.text);
      if (restarts > options_.max_restarts) {
        say(line + fmt::format("; that is failure {}, more than --max-restarts {}: the job ends",
                               restarts, options_.max_restarts));
        rdzv_->end(fmt::format("{} failure(s), more than --max-restarts {} allows", restarts,
                               options_.max_restarts));
        return finish(report_end(plan.round), /*linger=*/true);
      }
      if (cause.counts)
        say(line +
            fmt::format("; restart {} of {} (--max-restarts)", restarts, options_.max_restarts));
      else
        say(line + "; restarting (not counted against --max-restarts)");
      round = plan.round + 1;
    }
  }

  struct RoundOutcome {
    std::optional<StopCause> cause;  // none: every worker of the round succeeded
    int signal = 0;                  // this agent was interrupted
    int exit_code = 0;  // then: 128 + signal, or the requeue code if every worker saved its state
    bool requeue = false;  // the workers saved their state for a requeue: the agent ends
  };

  StoreLink link(const net::HostPort& at, milliseconds connect_timeout) {
    TcpStoreOptions o;
    o.host = at.host;
    o.port = at.port;
    o.timeout = kStoreCallTimeout;
    o.connect_timeout = connect_timeout;
    StoreLink l;
    l.tcp = std::make_shared<TcpStore>(o);
    l.store = std::make_shared<PrefixStore>("elastic/" + options_.run_id, l.tcp);
    return l;
  }

  // Hosts the rendezvous store when this machine is its endpoint (and nobody here has bound it
  // yet), then connects to it.
  void connect() {
    net::HostPort at;
    std::string how;
    if (options_.endpoint.empty()) {
      TcpStoreServerOptions so;
      so.host = "127.0.0.1";
      so.port = 0;
      server_ = std::make_unique<TcpStoreServer>(so);
      at = {"127.0.0.1", server_->port()};
      how = "hosts the rendezvous store (one machine)";
    } else {
      at = net::parse_host_port(options_.endpoint, "--rdzv-endpoint");
      if (is_local_address(at.host)) {
        try {
          TcpStoreServerOptions so;
          so.host = at.host;
          so.port = at.port;
          server_ = std::make_unique<TcpStoreServer>(so);
          how = "hosts the rendezvous store: its endpoint is on this machine";
        } catch (const Error& e) {
          // Another agent of this machine came first (or the port is taken by something else,
          // which the handshake below will say).
          DTRAIN_LOG_DEBUG("{}: cannot host the rendezvous store: {}", prefix_, e.what());
          how = "joins the rendezvous store, which another process of this machine serves";
        }
      } else {
        how = "joins the rendezvous store";
      }
    }
    main_ = link(at, options_.join_timeout);
    heartbeat_link_ = link(at, options_.join_timeout);
    watch_link_ = link(at, options_.join_timeout);
    store_at_ = at;
    endpoint_ = at.to_string();
    rdzv_ = std::make_unique<Rendezvous>(main_.store, rdzv_options_);

    AgentInfo info;
    info.node = node_;
    info.host = host_name();
    info.addr = options_.local_addr.empty() ? main_.tcp->local_ip() : options_.local_addr;
    // The address towards the endpoint is loopback when this machine's own name resolves to
    // 127.0.1.1 (Debian's default): other machines could not reach its workers or store.
    if (options_.max_nodes > 1 && options_.local_addr.empty() && info.addr.rfind("127.", 0) == 0 &&
        at.host.rfind("127.", 0) != 0 && at.host != "localhost")
      throw InvalidArgumentError(fmt::format(
          "dtrain run: this machine reaches the rendezvous endpoint {} over loopback (its host "
          "name probably resolves to 127.0.1.1), so the other machines could not reach it at {}; "
          "pass --local-addr with an address they can reach",
          at.to_string(), info.addr));
    info.pid = ::getpid();
    info.nproc = options_.nproc;
    me_ = rdzv_->register_agent(info);
    nonce_ = rdzv_->job_nonce();
    if (server_) main_.store->set("host", std::to_string(me_.id));
    std::string host_note;
    if (!server_ && main_.store->check({"host"}))
      host_note = fmt::format(", hosted by agent {}", main_.store->get_string("host"));
    DTRAIN_LOG_INFO(
        "{}: agent {} (pid {}, {}) {} at {}{} for job '{}' (--nnodes {}:{}, "
        "--max-restarts {})",
        prefix_, me_.id, me_.pid, me_.addr, how, endpoint_, host_note, options_.run_id,
        options_.min_nodes, options_.max_nodes, options_.max_restarts);
  }

  void start_heartbeat() {
    HeartbeatOptions o;
    o.key = Rendezvous::heartbeat_key(me_.id);
    o.interval = std::clamp(options_.heartbeat_timeout / 5, milliseconds(50), milliseconds(1000));
    o.log_prefix = prefix_;
    // A new connection is tried for a second at most: stopping the heartbeat never waits
    // longer, and the interval after it brings the next try.
    heartbeat_ = std::make_unique<Heartbeat>(
        heartbeat_link_.store, [this] { return link(store_at_, milliseconds(1000)).store; }, o);
  }

  // A machine whose workers caused exclude_after failures within exclude_for sits out until
  // exclude_for has passed since its last one, unless the job would then have fewer than MIN.
  // Returns an exit code when the job ended meanwhile.
  std::optional<int> sit_out_if_excluded() {
    if (options_.exclude_after <= 0) return std::nullopt;
    std::vector<double> times = rdzv_->node_failures(node_);
    const double window = options_.exclude_for.count() / 1000.0;
    const double now = unix_now();
    auto recent =
        std::count_if(times.begin(), times.end(), [&](double t) { return t >= now - window; });
    if (recent < options_.exclude_after) return std::nullopt;
    // The machines of the latest round, this one aside: the job keeps them while this one waits.
    int others = 0;
    int64_t latest = rdzv_->latest_closed(std::max<int64_t>(rdzv_->open_round() - 1, 0));
    if (latest >= 0)
      for (const auto& m : rdzv_->read_plan(latest).members) others += m.id != me_.id ? 1 : 0;
    if (others < options_.min_nodes) {
      say(fmt::format(
          "{}: this node's workers caused {} failure(s) in the last {:g} s, but the job needs it "
          "to keep --nnodes at least {}: it stays in",
          prefix_, recent, window, options_.min_nodes));
      return std::nullopt;
    }
    const double until = *std::max_element(times.begin(), times.end()) + window;
    say(fmt::format(
        "{}: excluding this node for {:.0f} s: its workers caused {} failure(s) in the last {:g} "
        "s (--exclude-after {}, --exclude-for {:g}); it rejoins at a restart after that",
        prefix_, until - now, recent, window, options_.exclude_after, window));
    while (unix_now() < until) {
      if (int sig = supervisor_.take_signal()) {
        say(fmt::format("{}: got {} while excluded; leaving the job", prefix_, signal_name(sig)));
        return 128 + sig;
      }
      if (rdzv_->end_reason()) return report_end(std::max<int64_t>(latest, 0));
      latest = rdzv_->latest_closed(std::max<int64_t>(latest, 0));
      if (rdzv_->complete(latest)) {
        say(fmt::format("{}: the job finished while this node was excluded", prefix_));
        return 0;
      }
      std::this_thread::sleep_for(rdzv_options_.poll_interval);
    }
    return std::nullopt;
  }

  // The workers' job id in a round: their store and connections refuse workers of other rounds,
  // and their shared-memory segments (named after it) never meet another job's.
  std::string round_job_id(int64_t round) const {
    return fmt::format("{}-{}-round{}", options_.run_id, nonce_, round);
  }

  // Why the round stops, recorded in its store for every agent. A store that cannot take it is
  // logged, not thrown: the other agents learn of the stop from the heartbeats then.
  void record_stop(int64_t round, const StopCause& c, std::string_view what) {
    try {
      rdzv_->stop(round, c);
    } catch (const Error& e) {
      DTRAIN_LOG_WARN("{}: cannot record {} in the store: {}", prefix_, what, e.what());
    }
  }

  // This agent leaves the job (a signal, a requeue): the round stops without counting against
  // the restarts.
  StopCause left(std::string text, double round_seconds) const {
    StopCause c;
    c.kind = Kind::kAgentLeft;
    c.counts = false;
    c.agent = me_;
    c.round_seconds = round_seconds;
    c.text = std::move(text);
    return c;
  }

  std::vector<WorkerSpec> worker_specs(const RoundPlan& plan, int node_rank,
                                       const std::string& master_addr, uint16_t master_port,
                                       const std::string& flight_dir) {
    std::vector<WorkerSpec> workers;
    const auto cpus = options_.bind ? allowed_cpus() : std::vector<int>{};
    const int base = plan.first_rank(node_rank);
    const std::string restarts = std::to_string(plan.restarts);
    for (int local = 0; local < options_.nproc; ++local) {
      int rank = base + local;
      workers.push_back(WorkerSpec{
          rank,
          {{"RANK", std::to_string(rank)},
           {"WORLD_SIZE", std::to_string(plan.world_size())},
           {"LOCAL_RANK", std::to_string(local)},
           {"LOCAL_WORLD_SIZE", std::to_string(options_.nproc)},
           {"NODE_RANK", std::to_string(node_rank)},
           {"GROUP_RANK", std::to_string(node_rank)},
           {"GROUP_WORLD_SIZE", std::to_string(plan.members.size())},
           {"MASTER_ADDR", master_addr},
           {"MASTER_PORT", std::to_string(master_port)},
           {"DTRAIN_AGENT_STORE", "1"},
           // A job id per round: the round's store and connections refuse a worker of another.
           {"DTRAIN_JOB_ID", round_job_id(plan.round)},
           {"DTRAIN_RESTART_COUNT", restarts},
           {"TORCHELASTIC_RESTART_COUNT", restarts},
           {"TORCHELASTIC_USE_AGENT_STORE", "True"},
           {"TORCHELASTIC_MAX_RESTARTS", std::to_string(options_.max_restarts)},
           {"TORCHELASTIC_RUN_ID", options_.run_id}}});
      if (!commit_dir_->path().empty())
        workers.back().env.emplace_back("DTRAIN_COMMIT_DIR", commit_dir_->path());
      workers.back().env.emplace_back(env::kFlightDir.name, flight_dir);
      for (const auto& e : options_.env) workers.back().env.push_back(e);
      workers.back().cpus = cpu_share(local, options_.nproc, cpus);
      if (static_cast<size_t>(local) < options_.local_ranks.size()) {
        const auto& mine = options_.local_ranks[local];
        workers.back().env.emplace_back("CUDA_VISIBLE_DEVICES", mine.visible_devices);
        if (!mine.cpus.empty()) workers.back().cpus = mine.cpus;
      }
    }
    return workers;
  }

  // Node 0 hosts the round's workers' store; the others wait for its port. std::nullopt when
  // the round stopped meanwhile.
  std::optional<uint16_t> round_store(const RoundPlan& plan, int node_rank,
                                      std::unique_ptr<TcpStoreServer>& server) {
    if (node_rank == 0) {
      TcpStoreServerOptions so;
      so.host = me_.addr.rfind("127.", 0) == 0 ? "127.0.0.1" : "";
      so.port = 0;
      so.job_id = round_job_id(plan.round);
      so.torch_clients = true;  // a PyTorch script's init_process_group uses it, as under torchrun
      server = std::make_unique<TcpStoreServer>(so);
      rdzv_->set_master(plan.round, std::to_string(server->port()));
      return server->port();
    }
    const AgentInfo& zero = plan.members.front();
    auto deadline = Deadline::after(kMasterTimeout);
    for (;;) {
      if (auto port = rdzv_->master(plan.round)) return static_cast<uint16_t>(std::stoi(*port));
      if (rdzv_->stop_cause(plan.round)) return std::nullopt;
      if (deadline.expired()) {
        StopCause c;
        c.kind = Kind::kAgentLost;
        c.agent = zero;
        c.text = fmt::format("{} (node rank 0) did not open round {}'s store within {}",
                             zero.describe(), plan.round, deadline.describe());
        rdzv_->stop(plan.round, c);
        return std::nullopt;
      }
      std::this_thread::sleep_for(rdzv_options_.poll_interval);
    }
  }

  RoundOutcome run_round(const RoundPlan& plan) {
    const int node_rank = plan.node_rank(me_.id);
    const AgentInfo& zero = plan.members.front();
    std::unique_ptr<TcpStoreServer> worker_store;
    auto port = round_store(plan, node_rank, worker_store);
    if (!port) return {rdzv_->wait_stop_cause(plan.round, kStoreCallTimeout), 0};
    const int first = plan.first_rank(node_rank);
    DTRAIN_LOG_INFO("{}: round {}: {}; this is node rank {} with ranks {}..{}; restart count {}",
                    prefix_, plan.round, plan.describe(), node_rank, first,
                    first + options_.nproc - 1, plan.restarts);

    // Each round's records in a directory of its own: a stuck round's outlive the next.
    const FlightDir round_flight = flight_.sub(fmt::format("round{}", plan.round));
    SupervisorOptions so;
    so.command = options_.command;
    so.workers = worker_specs(plan, node_rank, zero.addr, *port, round_flight.path());
    if (options_.on_round) options_.on_round(static_cast<int>(plan.restarts), first);
    so.prefix_output = options_.prefix_output;
    so.grace_period = options_.grace_period;
    so.report_failure = false;
    so.failure_records = round_flight.path();
    const auto started = Clock::now();
    const double started_unix = unix_now();
    RoundWatch watch(watch_link_.store, plan, me_, rdzv_options_, started);
    // This machine's workers, watched as `dtrain run` watches its own: a round stuck in a
    // collective is diagnosed, stopped and counted as a failure.
    const auto hang_after = env::get_seconds(env::kHangSeconds);
    HangMonitor hang({.dir = round_flight.path(),
                      .hang = hang_after,
                      .name = prefix_,
                      .stopping = "this machine's workers"});
    so.stop_fds = {watch.fd(), hang.stop_fd()};
    so.on_exit = [&round_flight](const WorkerExit& e) {
      round_flight.write_exit_word(e.rank, e.how());
    };
    so.on_sigusr2 = [&hang] { hang.request_records(); };
    so.on_failure = [&](const WorkerExit& w) {
      stopped_at_ = Clock::now();
      StopCause c;
      c.kind = Kind::kWorkerFailed;
      c.agent = me_;
      c.rank = w.rank;
      c.exit_code = w.exit_code;
      c.signal = w.signal;
      c.stderr_tail = w.stderr_tail;
      c.round_seconds = seconds_between(started, *stopped_at_);
      c.text = fmt::format("rank {} (pid {}) on {} {}; {}", w.rank, w.pid, me_.describe(), w.how(),
                           tail_in_one_line(w.stderr_tail));
      record_stop(plan.round, c, fmt::format("the failure of rank {}", w.rank));
    };
    // Where the workers resumed from, as the first of them announces it in the round's store
    // (dtrain::announce_resumed); every agent says it, and records it for the job's summary.
    const std::optional<Clock::time_point> previous_stop = stopped_at_;
    ResumeWatch resume_watch(zero.addr, *port, round_job_id(plan.round), [&](std::string line) {
      std::string after;
      if (previous_stop)
        after = fmt::format(", training again {:.2f} s after round {} stopped",
                            seconds_between(*previous_stop, Clock::now()), plan.round - 1);
      say(fmt::format("{}: round {}: {}{}", prefix_, plan.round, line, after));
      if (node_rank != 0) return;  // one agent records it
      try {
        rdzv_->set_resumed(plan.round, line + after);
      } catch (const Error& e) {
        DTRAIN_LOG_WARN("{}: cannot record the resumption in the store: {}", prefix_, e.what());
      }
    });

    SupervisorResult result = supervisor_.supervise(so);
    using Outcome = SupervisorResult::Outcome;
    if (hang.fired()) {
      stopped_at_ = Clock::now();
      StopCause c;
      c.kind = Kind::kWorkerFailed;
      c.agent = me_;
      c.exit_code = kStuckExitCode;
      c.round_seconds = seconds_between(started, *stopped_at_);
      c.text = fmt::format(
          "the workers on {} were stuck: no rank completed a call for {:g} s while some waited in "
          "one (DTRAIN_HANG_SECONDS); flight records in {}",
          me_.describe(), hang_after.count() / 1000.0, round_flight.path());
      record_stop(plan.round, c, "the stuck round");
      if (auto cause = rdzv_->stop_cause(plan.round)) return {std::move(cause), 0};
      return {c, 0};
    }
    if (result.outcome == Outcome::kFailed) {
      // A failure that wrote flight records (a timeout, a mismatch, a dead peer): what they say.
      std::string diagnosis = diagnose_directory(round_flight.path(), started_unix);
      if (!diagnosis.empty() && diagnosis.back() == '\n') diagnosis.pop_back();
      if (!diagnosis.empty()) say(diagnosis);
    }
    if (result.outcome == Outcome::kInterrupted || result.interrupted_by != 0) {
      record_stop(plan.round,
                  left(fmt::format("the agent of {} got {} and left the job", me_.describe(),
                                   signal_name(result.interrupted_by)),
                       seconds_between(started, Clock::now())),
                  "that this agent leaves");
      return {std::nullopt, result.interrupted_by, result.exit_code};
    }
    if (result.outcome == Outcome::kRequeued) {
      // Preempted: the workers agreed on a step, saved it and exited; the job resumes when the
      // engine runs it again, not in a new round here (the machines are being taken away).
      record_stop(plan.round,
                  left(fmt::format("the workers of {} saved their state for a requeue (preempted)",
                                   me_.describe()),
                       seconds_between(started, Clock::now())),
                  "the requeue");
      return {std::nullopt, 0, result.exit_code, /*requeue=*/true};
    }
    if (result.outcome == Outcome::kSucceeded) {
      rdzv_->mark_done(plan);
      // Wait for the other machines' workers, or for the round to stop after all. Not forever:
      // the watch fires as soon as one of them stops heartbeating.
      for (;;) {
        pollfd fds[2] = {{watch.fd(), POLLIN, 0}, {supervisor_.signal_fd(), POLLIN, 0}};
        ::poll(fds, 2, -1);
        if (watch.event() != RoundWatch::Event::kNone) break;
        if (int sig = supervisor_.take_signal()) {
          record_stop(plan.round,
                      left(fmt::format("the agent of {} got {} and left the job", me_.describe(),
                                       signal_name(sig)),
                           seconds_between(started, Clock::now())),
                      "that this agent leaves");
          return {std::nullopt, sig, 128 + sig};
        }
      }
    } else if (result.outcome == Outcome::kFailed) {
      // Failed here: the cause is recorded (this one, or an earlier one from elsewhere).
      if (auto cause = rdzv_->stop_cause(plan.round)) return {std::move(cause), 0};
    }
    if (watch.event() == RoundWatch::Event::kNone) {
      pollfd fd{watch.fd(), POLLIN, 0};
      ::poll(&fd, 1, static_cast<int>(kStoreCallTimeout.count()));
    }
    switch (watch.event()) {
      case RoundWatch::Event::kComplete:
        return {std::nullopt, 0};
      case RoundWatch::Event::kStoreLost:
        throw StoreError(watch.error());  // run() says what it means
      case RoundWatch::Event::kStopped:
      case RoundWatch::Event::kNone:
        break;
    }
    if (result.outcome != Outcome::kFailed)  // on_failure took the time of the failure here
      stopped_at_ = watch.event() == RoundWatch::Event::kStopped ? watch.when() : Clock::now();
    return {rdzv_->wait_stop_cause(plan.round, kStoreCallTimeout), 0};
  }

  // Prints why the job ended and every round's story; returns the exit code.
  int report_end(int64_t round_hint) {
    int64_t last = rdzv_->latest_closed(std::max<int64_t>(round_hint, 0));
    int code = 1;
    for (int64_t r = last; r >= 0; --r) {
      auto cause = rdzv_->stop_cause(r);
      if (cause && cause->counts) {
        code = cause->exit_status();
        break;
      }
    }
    std::string reason = rdzv_->end_reason().value_or("too many failures");
    std::string rounds = rdzv_->history(last);
    if (!rounds.empty() && rounds.back() == '\n') rounds.pop_back();
    say(fmt::format("{}: job '{}' failed: {}. Its rounds:\n{}", prefix_, options_.run_id, reason,
                    rounds));
    return code;
  }

  // Tells the others this agent is done with the store. When the job is over (linger), its host
  // waits for them to read their last keys; an interrupted host leaves at once.
  int finish(int code, bool linger) {
    if (heartbeat_) heartbeat_->stop();
    try {
      rdzv_->mark_gone(me_.id);
      if (server_ && linger) rdzv_->wait_for_others_gone(me_.id, kLingerTimeout);
    } catch (const Error& e) {
      DTRAIN_LOG_DEBUG("{}: store gone while leaving: {}", prefix_, e.what());
    }
    return code;
  }

  const ElasticOptions& options_;
  Supervisor& supervisor_;
  std::string node_;
  std::string prefix_;
  RendezvousOptions rdzv_options_;
  std::unique_ptr<TcpStoreServer> server_;  // when this agent hosts the rendezvous store
  std::string endpoint_;
  StoreLink main_, heartbeat_link_, watch_link_;  // one connection per thread
  std::unique_ptr<Rendezvous> rdzv_;
  AgentInfo me_;
  std::string nonce_;  // this run of the job, as opposed to an earlier one with the same id
  std::optional<Clock::time_point> stopped_at_;    // when the last round stopped, by this clock
  std::unique_ptr<CommitDir> commit_dir_;          // the workers' DTRAIN_COMMIT_DIR
  const FlightDir flight_ = FlightDir::prepare();  // the job's: a round<N> in it per round
  net::HostPort store_at_;                         // the rendezvous store
  std::unique_ptr<Heartbeat> heartbeat_;           // last: stopped and joined first
};

void validate(const ElasticOptions& o) {
  if (o.command.empty())
    throw InvalidArgumentError("dtrain run needs a worker command: dtrain run -n 2 -- ./train");
  if (o.nproc < 1)
    throw InvalidArgumentError(
        fmt::format("--nproc-per-node is {}: start at least one worker", o.nproc));
  if (o.min_nodes < 1 || o.max_nodes < o.min_nodes)
    throw InvalidArgumentError(fmt::format(
        "--nnodes {}:{}: MIN must be at least 1 and MAX at least MIN", o.min_nodes, o.max_nodes));
  if (o.max_restarts < 0)
    throw InvalidArgumentError(
        fmt::format("--max-restarts is {}: it cannot be negative", o.max_restarts));
  if (o.endpoint.empty() && o.max_nodes > 1)
    throw InvalidArgumentError(fmt::format(
        "--nnodes {}:{} needs --rdzv-endpoint HOST:PORT (or --master-addr/--master-port): the "
        "agents of the other machines must find the rendezvous store",
        o.min_nodes, o.max_nodes));
  if (o.run_id.empty() || o.run_id.size() > 128)
    throw InvalidArgumentError("--rdzv-id must have 1 to 128 characters");
  if (o.last_call.count() < 0 || o.heartbeat_timeout.count() <= 0 || o.join_timeout.count() <= 0)
    throw InvalidArgumentError(
        "--rdzv-last-call cannot be negative, --rdzv-timeout and --heartbeat-timeout must be "
        "positive");
}

}  // namespace

int run_elastic(const ElasticOptions& options) {
  validate(options);
  find_executable(options.command.at(0));  // a bad command fails here, not once per round
  // Before any thread (the store's, the heartbeat's): they inherit the blocked signals.
  Supervisor supervisor;
  Agent agent(options, supervisor);
  return agent.run();
}

}  // namespace dtrain::launch
