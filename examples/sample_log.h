// The examples' sample log (--sample-log, DTRAIN_SAMPLE_LOG, which `dtrain chaos` sets): what
// every rank trained, sample by sample, for launch/sample_ledger.h to count samples lost and
// repeated under faults.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dtrain/error.h"

// --sample-log: one "epoch index step restart" line per trained sample, one write per step
// (appended with O_APPEND, so the ranks can share the file and a killed rank loses at most its
// current step). After a failure the steps since the last commit or checkpoint are trained again
// and logged twice; the work that counts is, for each step, the lines of the latest restart
// (DTRAIN_RESTART_COUNT) that logged it: that run's state is the one training went on from.
class SampleLog {
 public:
  explicit SampleLog(const std::string& path) {
    if (path.empty()) return;
    const char* restart = std::getenv("DTRAIN_RESTART_COUNT");
    restart_ = restart != nullptr && *restart != '\0' ? std::atoll(restart) : 0;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw dtrain::InvalidArgumentError(
          fmt::format("--sample-log: cannot open {}: {}", path, std::strerror(errno)));
  }
  ~SampleLog() {
    if (fd_ >= 0) ::close(fd_);
  }
  SampleLog(const SampleLog&) = delete;
  SampleLog& operator=(const SampleLog&) = delete;
  // Under `dtrain run --live` nothing restarts: the live world's generation numbers the
  // attempts instead (a step redone after a re-forming supersedes its earlier lines).
  void set_attempt(int64_t attempt) { restart_ = attempt; }
  void record(int64_t epoch, int64_t step, const std::vector<int64_t>& batch) {
    if (fd_ < 0) return;
    std::string text;
    for (int64_t i : batch) text += fmt::format("{} {} {} {}\n", epoch, i, step, restart_);
    for (size_t done = 0; done < text.size();) {
      ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        throw dtrain::InvalidArgumentError(
            fmt::format("--sample-log: write failed: {}", std::strerror(errno)));
      done += static_cast<size_t>(n);
    }
  }

 private:
  int fd_ = -1;
  int64_t restart_ = 0;
};
