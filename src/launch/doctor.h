// `dtrain doctor`: reads the flight records of every rank of a job (comm/flight_recorder.h, one
// rank<R>.json each) together and says in plain words what went wrong:
//   - which ranks never entered the collective the others have waited in for a second or more,
//     and what they do instead (their last call, and where their threads are);
//   - the first call where ranks disagree (another collective, or other arguments);
//   - ranks that never submitted a named (Horovod) call the others wait in;
//   - point-to-point calls that wait on each other in a cycle (a deadlock);
//   - a rank much slower than the others between calls, and by how much;
//   - ranks whose record is missing (dead, or stopped before they could write it).
// `dtrain run` runs the same diagnosis when it finds a job stuck (launch/hang_monitor.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dtrain::launch {

// One call of a rank's record. Times are seconds since the epoch; nullopt when it has not
// happened (not started, not ended).
struct RecordedCall {
  std::string kind;  // collective, send, recv, recv_any, named (Horovod's, matched by name)
  std::string name;  // named calls: the tensor's name
  std::string group;
  uint32_t seq = 0;
  std::string op;     // all_reduce, broadcast, ..., send, recv
  std::string call;   // "all_reduce(f32, 1024, sum)", "recv(40 bytes from rank 1, tag 0)"
  std::string state;  // queued, running, completed, failed
  int peer = -1;
  int tag = 0;
  int thread = 0;
  double enqueued = 0;
  std::optional<double> started, ended;
  std::string caller;  // the C++ code that called dtrain ("main +0x55 (worker)")
  std::string python;  // the Python code that did ("train.py:42 in step <- train.py:88 in main")
  bool pending() const { return state == "queued" || state == "running"; }
};

struct RecordedThread {
  int tid = 0;
  std::string name;
  std::vector<std::string> stack;  // C++ frames, innermost first
};

struct RankRecord {
  std::string path;
  int rank = -1;
  int world_size = 0;
  int pid = 0;
  std::string host;
  std::string reason;               // why it was dumped
  double time = 0;                  // when
  std::vector<std::string> groups;  // every group the rank made (named in its calls)
  std::vector<RecordedCall> calls;  // oldest first
  std::vector<RecordedThread> threads;
  std::string python_stacks;  // faulthandler's text, when the process runs Python
};

// Every rank<R>.json (and pid<P>.json) in `dir`, by rank. Throws InvalidArgumentError naming the
// directory when it holds none, and the file with what is wrong when one cannot be read.
std::vector<RankRecord> read_flight_records(const std::string& dir);

struct Finding {
  // never_entered, mismatch, deadlock, slow, failed, missing
  std::string kind;
  std::string group;
  uint32_t seq = 0;
  std::vector<int> ranks;  // the ranks at fault
  std::string text;        // the whole finding, in words
};

struct Diagnosis {
  std::vector<Finding> findings;  // most telling first
  bool healthy() const { return findings.empty(); }
};

Diagnosis diagnose(const std::vector<RankRecord>& records);

// The diagnosis as text: a line about the records, then one paragraph per finding.
std::string describe(const Diagnosis& diagnosis, const std::vector<RankRecord>& records,
                     const std::string& dir);
nlohmann::json to_json(const Diagnosis& diagnosis, const std::vector<RankRecord>& records);

}  // namespace dtrain::launch
