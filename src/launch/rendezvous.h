// Elastic rendezvous: the agents of a job (one `dtrain run` per machine) agree, through the
// store, on who takes part in each numbered round of training.
//
// An agent joins the open round; the round closes when MAX agents have joined, or at least MIN
// and a last-call window has passed since there were MIN. Whoever sees that first writes the
// round's plan with compare_set (one plan wins); node ranks follow agent ids, which the store
// hands out in arrival order, so older agents keep the low ranks. A round forms only once the
// previous one has stopped: an agent arriving while a round runs waits, and asks that round to
// stop at once (a restart boundary) when the job has room for it. When a round stops, its
// cause is recorded once (the first reporter wins) and every agent reads the same one, so all of
// them count restarts alike.
//
// Keys, all under the job's prefix:
//   agents, agent/<id>, hb/<id>         agent ids, what each agent is, heartbeat counters
//   nonce                                a random word naming this run of the job
//   open                                 the round that accepts joins (a hint for newcomers)
//   round/<r>/count, round/<r>/slot/<k>  who joined round r, in order
//   round/<r>/plan                       the members of round r, in node-rank order
//   round/<r>/master                     port of round r's workers' store (at node 0's address)
//   round/<r>/stop                       why round r stopped (the first cause recorded)
//   round/<r>/done, round/<r>/complete   agents whose workers all succeeded; set when all did
//   round/<r>/resumed                    the first "resumed from ..." line of round r
//   end                                  set when the job ended for everyone (too many restarts)
//   node/<name>/failures                 when the workers of a machine failed (exclusion)
//   gone/<id>                            an agent that has finished and no longer needs the store
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "dtrain/store.h"

namespace dtrain::launch {

// One agent (one `dtrain run` on one machine).
struct AgentInfo {
  int64_t id = -1;   // from the store, in arrival order; unique for the job's lifetime
  std::string node;  // --node-name (default: the host name); failures are counted per node
  std::string host;  // the host name
  std::string addr;  // where other machines reach this one
  int64_t pid = 0;
  int nproc = 1;  // workers it starts
  // "node b (10.0.0.2, agent 2, pid 812)"
  std::string describe() const;
};

// A closed round: who takes part, in node-rank order.
struct RoundPlan {
  int64_t round = 0;
  std::vector<AgentInfo> members;
  int64_t restarts = 0;                // failures before this round, counted against --max-restarts
  int node_rank(int64_t agent) const;  // -1 for an agent outside the round
  int world_size() const;
  int first_rank(int node_rank) const;  // global rank of that node's local rank 0
  std::string describe() const;         // "2 nodes (a, b), 6 workers"
};

// Why a round stopped.
struct StopCause {
  enum class Kind {
    kWorkerFailed,  // a worker exited non-zero or was killed
    kAgentLost,     // an agent stopped heartbeating (its machine died, or it was killed)
    kAgentLeft,     // an agent was told to stop (SIGTERM, Ctrl-C): it leaves the job
    kNodeJoining,   // an agent is waiting to join and the job has room for it
  };
  Kind kind = Kind::kWorkerFailed;
  bool counts = true;  // against --max-restarts: failures do, departures and arrivals do not
  AgentInfo agent;     // the agent the cause is about
  int rank = -1;       // the failing worker
  int exit_code = 0;
  int signal = 0;
  std::vector<std::string> stderr_tail;
  double round_seconds = -1;  // how long the round had run when it stopped (-1: unknown)
  // "rank 2 on node a (127.0.0.1, agent 1, pid 90) was killed by SIGKILL; last stderr: ..."
  std::string text;
  int exit_status() const;  // for `dtrain run` when this failure ends the job

  std::string to_json() const;
  static StopCause from_json(const std::string& text);
};

struct RendezvousOptions {
  int min_nodes = 1;
  int max_nodes = 1;
  int64_t max_restarts = 0;
  std::chrono::milliseconds join_timeout{600'000};  // to form a round once the previous ended
  std::chrono::milliseconds last_call{2000};        // after MIN agents joined, for more to come
  std::chrono::milliseconds heartbeat_timeout{10'000};
  std::chrono::milliseconds poll_interval{100};
  std::string log_prefix;  // "dtrain run [node a]"
};

// Which agents still beat: a heartbeat counter that has not moved for the timeout, by this
// agent's own clock (machines need no common time), means that agent is gone. An agent first
// seen now counts as having beaten now.
class Liveness {
 public:
  explicit Liveness(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  // Reads the counters of `agents` (one store call).
  void observe(Store& store, const std::vector<int64_t>& agents);
  bool alive(int64_t agent) const;
  std::chrono::milliseconds silent_for(int64_t agent) const;

 private:
  struct Seen {
    std::string value;
    Clock::time_point changed;
  };
  std::chrono::milliseconds timeout_;
  std::map<int64_t, Seen> seen_;
};

class Rendezvous {
 public:
  // `store` holds only this job's keys (a PrefixStore over the rendezvous store).
  Rendezvous(std::shared_ptr<Store> store, RendezvousOptions options);

  // Gives `info` an id, publishes it and beats once.
  AgentInfo register_agent(AgentInfo info);

  struct Joined {
    enum class Result {
      kJoined,       // plan holds this agent's round
      kComplete,     // the job finished while this agent waited
      kEnded,        // the job ended for everyone (see end_reason)
      kInterrupted,  // interrupted() returned a signal
    };
    Result result = Result::kJoined;
    RoundPlan plan;
    int signal = 0;
  };
  // Joins round `round` (or the first later one still open) and waits until a round that
  // includes this agent closes. interrupted() is asked between polls (a signal number, or 0).
  // Throws TimeoutError naming the agents missing when a round does not form within
  // join_timeout of the previous one stopping.
  Joined join(const AgentInfo& me, int64_t round, const std::function<int()>& interrupted);

  // A random word that names this run of the job (the first agent picks it).
  std::string job_nonce();
  // The round newcomers join.
  int64_t open_round();
  // The latest round that closed at or after `from` (-1 when none has).
  int64_t latest_closed(int64_t from);

  // Records why round r stops unless a cause is recorded already; returns the recorded one.
  StopCause stop(int64_t round, const StopCause& cause);
  std::optional<StopCause> stop_cause(int64_t round);
  // Waits (up to `limit`) for round r's cause, which another agent is recording.
  StopCause wait_stop_cause(int64_t round, std::chrono::milliseconds limit);

  // This agent's workers all succeeded; true when it was the last of the round's members.
  bool mark_done(const RoundPlan& plan);
  bool complete(int64_t round);

  void set_master(int64_t round, const std::string& port);
  std::optional<std::string> master(int64_t round);
  void set_resumed(int64_t round, const std::string& line);
  std::optional<std::string> resumed(int64_t round);

  // The job is over for everyone: too many restarts. The first reason recorded wins.
  void end(const std::string& reason);
  std::optional<std::string> end_reason();

  // Failures of one machine's workers, as Unix times (seconds); add one with record_failure.
  std::vector<double> node_failures(const std::string& node);
  void record_failure(const std::string& node, double unix_time);

  // Rounds 0..last with their plans and causes, for the final summary.
  std::string history(int64_t last);

  void mark_gone(int64_t agent);
  // The agent hosting the store waits (up to `limit`) for the others to finish with it.
  void wait_for_others_gone(int64_t me, std::chrono::milliseconds limit);

  Store& store() { return *store_; }
  const RendezvousOptions& options() const { return options_; }

  static std::string heartbeat_key(int64_t agent);
  RoundPlan read_plan(int64_t round);
  bool gone(int64_t agent);

 private:
  AgentInfo agent_info(int64_t agent);
  // Closes round r with `members` unless someone else closed it first.
  void close(int64_t round, std::vector<int64_t> members);
  int64_t restarts_before(int64_t round);
  std::string missing_report(int64_t round, const std::vector<int64_t>& joined);

  std::shared_ptr<Store> store_;
  RendezvousOptions options_;
  std::map<int64_t, AgentInfo> agents_;  // cache: an agent's info never changes
};

}  // namespace dtrain::launch
