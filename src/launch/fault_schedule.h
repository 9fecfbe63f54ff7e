// A seeded schedule of faults for `dtrain chaos` (tools/dtrain/cmd_chaos.cc): what to inject
// into a running job, how often, and for how long.
//
//   kill:30s            SIGKILL a random worker every 30 s
//   stop:90s:5s         SIGSTOP a random worker every 90 s, SIGCONT it 5 s later
//   disk:60s:5s         fill the file system of the job's checkpoints (dtrain chaos --fill-dir)
//                       every 60 s, for 5 s
//   cut:120s:10s        cut a random worker's host off the network every 120 s, for 10 s (its
//                       host is a network namespace: scripts/netns-hosts.sh)
//   store:300s          SIGKILL the host of the job's store every 300 s
//   kill:30s,stop:90s:5s   both, each on its own clock
//
// Times count from when the job starts training (its first sample), so that start-up, which
// differs from run to run, does not decide which faults land. Which worker each fault hits is
// drawn from the seed: the same seed and the same live workers give the same victims.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace dtrain::launch {

enum class FaultKind { kKill, kStop, kDisk, kCut, kStore };

struct FaultRule {
  FaultKind kind = FaultKind::kKill;
  std::chrono::milliseconds every{0};
  std::chrono::milliseconds lasting{0};  // kStop, kDisk, kCut: how long the fault lasts
};

// "kill", "stop", "disk", "cut", "store".
std::string_view fault_name(FaultKind kind);

// The rules `spec` says, in order. Throws InvalidArgumentError naming the part it cannot read
// and what it accepts (`--schedule`).
std::vector<FaultRule> parse_fault_schedule(const std::string& spec);

// When each rule fires: the next fault due, and the victims drawn from the seed.
class FaultClock {
 public:
  FaultClock(std::vector<FaultRule> rules, uint64_t seed);

  struct Due {
    size_t rule = 0;
    std::chrono::milliseconds at{0};  // since training started
  };
  // The earliest fault not yet fired.
  Due next() const;
  // Marks `next()` fired and returns its rule.
  const FaultRule& fire();
  // One of `count` workers, drawn from the seed.
  size_t pick(size_t count);

  const std::vector<FaultRule>& rules() const { return rules_; }

 private:
  std::vector<FaultRule> rules_;
  std::vector<int64_t> fired_;  // per rule
  std::mt19937_64 random_;
};

}  // namespace dtrain::launch
