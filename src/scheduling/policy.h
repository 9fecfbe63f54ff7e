// Which active jobs hold GPUs next: the scheduling policies. Every policy is gang-scheduling (a
// job gets all the GPUs it asks for or none) and is called once per scheduling interval.
//   fifo:     by submission, never preempting; the first job that does not fit blocks the
//             ones behind it (head-of-line blocking, as a plain batch queue does).
//   srtf:     shortest remaining time first, preemptive, with the remaining time known
//             (an oracle, as in Tiresias' comparison); a job that does not fit lets smaller
//             ones behind it run.
//   tiresias: two-dimensional least attained service (Gu et al., NSDI 2019) discretized into
//             two queues as in Pollux's simulator: every job starts in the first queue and moves
//             to the second once it has held GPUs for `demote_gpu_seconds` GPU-seconds
//             (16 GPU-hours); first queue before second, arrival order within a queue
//             (order of demotion in the second), skipping jobs that do not fit; preemptive.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::scheduling {

// What a policy may know of an active (submitted, unfinished) job.
struct JobView {
  int id = 0;         // stable across calls
  double submit = 0;  // seconds
  int gpus = 0;
  bool holds_gpus = false;  // it was chosen at the previous call
  double remaining = 0;     // seconds to finish at its GPUs, placed tightly (srtf's oracle)
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view name() const = 0;
  // The ids of the jobs that should hold GPUs now, in priority order (the order in which new
  // ones are placed). `jobs` is in submission order; their GPUs together may exceed the cluster.
  virtual std::vector<int> choose(double now, const std::vector<JobView>& jobs, int total_gpus) = 0;
};

struct PolicyOptions {
  double demote_gpu_seconds = 16 * 3600.0;  // tiresias: the first queue's limit
};

// "fifo", "srtf" or "tiresias"; throws InvalidArgumentError naming the choices otherwise.
std::unique_ptr<Policy> make_policy(std::string_view name, const PolicyOptions& options = {});
const std::vector<std::string>& policy_names();

}  // namespace dtrain::scheduling
