// The launcher's reading of a ProgressReporter's file (progress_file.h).
#include "launch/progress_file.h"

#include <fstream>
#include <iterator>
#include <utility>

#include <fmt/format.h>

namespace dtrain::launch {

std::string progress_file_name(int rank) { return fmt::format("rank{}.progress", rank); }

std::optional<ProgressReport> read_progress_file(const std::string& path, int rank) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  ProgressReport r;
  r.rank = rank;
  const std::pair<const char*, double*> fields[] = {
      {"step", &r.step},
      {"samples_total", &r.samples_total},
      {"compute_seconds_total", &r.compute_seconds_total},
      {"communication_seconds_total", &r.communication_seconds_total},
      {"window_seconds", &r.window_seconds},
      {"window_steps", &r.window_steps},
      {"window_samples", &r.window_samples},
      {"window_communication_seconds", &r.window_communication_seconds},
      {"time_unix", &r.time_unix}};
  size_t found = 0;
  std::string name;
  double value = 0;
  while (in >> name >> value) {
    for (const auto& [field, target] : fields)
      if (name == field) {
        *target = value;
        ++found;
      }
  }
  if (found != std::size(fields)) return std::nullopt;
  return r;
}

}  // namespace dtrain::launch
