#include "scheduling/workload.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <iomanip>
#include <sstream>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "scheduling/csv_table.h"

namespace dtrain::scheduling {
namespace {

// "YYYY-MM-DD HH:MM:SS" (or just the date) as seconds since the epoch, UTC.
bool parse_timestamp(const std::string& text, double* seconds) {
  std::tm tm{};
  std::istringstream in(text);
  in >> std::get_time(&tm, "%Y-%m-%d %H:%M:%S");
  if (in.fail()) {
    tm = {};
    std::istringstream date(text);
    date >> std::get_time(&tm, "%Y-%m-%d");
    if (date.fail() || date.peek() != EOF) return false;
  } else if (in.peek() != EOF) {
    return false;
  }
  *seconds = static_cast<double>(timegm(&tm));
  return true;
}

int positive_int(const CsvTable& t, size_t row, size_t col, const char* column) {
  const int64_t v = t.integer(row, col);
  if (v <= 0 || v > 1'000'000)
    throw InvalidArgumentError(
        fmt::format("{}: {} {} must be between 1 and 1000000", t.where(row), column, v));
  return static_cast<int>(v);
}

}  // namespace

std::vector<JobSpec> read_workload(const std::string& path, const WorkloadOptions& options) {
  const auto t = CsvTable::read(path);
  std::vector<JobSpec> jobs;
  if (t.has_column("application")) {
    const size_t name = t.column("name"), time = t.column("time"), app = t.column("application"),
                 replicas = t.column("num_replicas"), batch = t.column("batch_size");
    for (size_t r = 0; r < t.rows(); ++r) {
      JobSpec j;
      j.name = t.text(r, name);
      j.submit = t.number(r, time);
      if (j.submit < 0)
        throw InvalidArgumentError(fmt::format("{}: time {} is negative", t.where(r), j.submit));
      j.application = t.text(r, app);
      if (j.application.empty())
        throw InvalidArgumentError(fmt::format("{}: no application", t.where(r)));
      j.gpus = positive_int(t, r, replicas, "num_replicas");
      j.batch_size = positive_int(t, r, batch, "batch_size");
      if (j.batch_size < j.gpus)
        throw InvalidArgumentError(fmt::format("{}: batch_size {} is smaller than num_replicas {}",
                                               t.where(r), j.batch_size, j.gpus));
      jobs.push_back(std::move(j));
    }
  } else if (t.has_column("duration")) {
    const bool stamped = t.has_column("timestamp");
    const size_t when = t.column(stamped ? "timestamp" : "time"), duration = t.column("duration");
    const size_t gpus = t.column(t.has_column("num_gpus") ? "num_gpus" : "num_replicas");
    const bool named = t.has_column("name"), clustered = t.has_column("cluster");
    if (!options.cluster.empty() && !clustered)
      throw InvalidArgumentError(
          fmt::format("{}: a cluster was chosen but the file has no 'cluster' column", path));
    double start = -INFINITY;
    if (!options.start.empty() && !parse_timestamp(options.start, &start))
      throw InvalidArgumentError(
          fmt::format("start '{}' should read YYYY-MM-DD or 'YYYY-MM-DD HH:MM:SS'", options.start));
    if (!options.start.empty() && !stamped)
      throw InvalidArgumentError(
          fmt::format("{}: a start time was given but the file has no 'timestamp' column", path));
    for (size_t r = 0; r < t.rows(); ++r) {
      if (!options.cluster.empty() && t.text(r, t.column("cluster")) != options.cluster) continue;
      JobSpec j;
      if (stamped) {
        if (!parse_timestamp(t.text(r, when), &j.submit))
          throw InvalidArgumentError(fmt::format(
              "{}: timestamp '{}' should read YYYY-MM-DD HH:MM:SS", t.where(r), t.text(r, when)));
      } else {
        j.submit = t.number(r, when);
      }
      if (j.submit < start) continue;
      j.duration = t.number(r, duration);
      if (j.duration <= 0)
        throw InvalidArgumentError(
            fmt::format("{}: duration {} must be positive", t.where(r), j.duration));
      if (j.duration < options.min_duration) continue;
      j.gpus = positive_int(t, r, gpus, "num_gpus");
      j.name = named ? t.text(r, t.column("name")) : fmt::format("job-{}", t.line(r));
      jobs.push_back(std::move(j));
    }
    // The window starts at --start, or at the first job selected.
    double origin = start;
    if (options.start.empty() && !jobs.empty())
      origin = std::min_element(jobs.begin(), jobs.end(), [](auto& a, auto& b) {
                 return a.submit < b.submit;
               })->submit;
    if (options.hours > 0)
      std::erase_if(jobs,
                    [&](const JobSpec& j) { return j.submit >= origin + options.hours * 3600; });
    if (jobs.empty())
      throw InvalidArgumentError(fmt::format("{}: no job is left after the selection", path));
    if (stamped)
      for (auto& j : jobs) j.submit -= origin;
  } else {
    throw InvalidArgumentError(fmt::format(
        "{}: not a workload: needs the columns name,time,application,num_replicas,batch_size or "
        "(timestamp|time),num_gpus,duration",
        path));
  }
  if (jobs.empty()) throw InvalidArgumentError(fmt::format("{} has no jobs", path));
  std::stable_sort(jobs.begin(), jobs.end(),
                   [](const JobSpec& a, const JobSpec& b) { return a.submit < b.submit; });
  return jobs;
}

}  // namespace dtrain::scheduling
