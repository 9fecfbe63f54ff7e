// The file a ProgressReporter leaves for its launcher (DIR/rank<r>.progress): the latest report,
// replaced whole by rename so that a reader never sees half of one. "name value" lines:
//   step 120            samples_total 15360       compute_seconds_total 41.2
//   communication_seconds_total 3.9               window_seconds 0.51
//   window_steps 5      window_samples 640        window_communication_seconds 0.04
//   time_unix 1795000000.25
#pragma once

#include <map>
#include <optional>
#include <string>

namespace dtrain::launch {

struct ProgressReport {
  int rank = 0;
  double step = 0, samples_total = 0, compute_seconds_total = 0, communication_seconds_total = 0;
  double window_seconds = 0, window_steps = 0, window_samples = 0, window_communication_seconds = 0;
  double time_unix = 0;  // when it was written
};

std::string progress_file_name(int rank);  // "rank3.progress"

// The key of the round's store under which the first worker to resume says from where
// (dtrain::announce_resumed): "rank 0 resumed from ...".
inline constexpr const char* kResumedKey = "dtrain/resumed";

// The report in `path`, or nothing when it is missing or not a whole report (a worker that has
// not reported yet, or a stray file).
std::optional<ProgressReport> read_progress_file(const std::string& path, int rank);

}  // namespace dtrain::launch
