// ProgressReporter (include/dtrain/progress.h): what a worker tells its launcher. The launcher's
// reading of the file is launch/progress_file.cc.
#include "dtrain/progress.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "common/env.h"
#include "common/log.h"
#include "dtrain/error.h"
#include "dtrain/identity.h"
#include "dtrain/store.h"
#include "dtrain/work.h"
#include "launch/progress_file.h"

namespace dtrain {

void announce_resumed(int rank, const std::string& what) {
  if (!env::get_bool(env::kAgentStore)) return;
  const std::string line = fmt::format("rank {} resumed {}", rank, what);
  try {
    const Identity id = resolve_identity({});
    TcpStoreOptions so;
    so.host = id.master_addr;
    so.port = id.master_port;
    so.rank = rank;
    so.connect_timeout = std::chrono::seconds(10);
    so.timeout = std::chrono::seconds(10);
    TcpStore store(so);
    const std::string_view bytes = line;
    store.compare_set(launch::kResumedKey, {}, std::vector<uint8_t>(bytes.begin(), bytes.end()));
  } catch (const Error& e) {
    DTRAIN_LOG_WARN("rank {}: could not tell the launcher that it {}: {}", rank, line, e.what());
  }
}

ProgressReporter::ProgressReporter(int rank, ProgressOptions options) : options_(options) {
  const std::string dir = env::get_string(env::kProgressDir);
  if (!dir.empty()) path_ = dir + "/" + launch::progress_file_name(rank);
}

ProgressReporter::~ProgressReporter() {
  if (unwritten_) write();
}

void ProgressReporter::step(int64_t step, int64_t samples) {
  if (!active()) return;
  const auto now = Clock::now();
  const auto waited = communication_wait_time();
  if (last_step_ == Clock::time_point{}) {
    // The first call: the step before it had no start we know of.
    last_step_ = window_start_ = now;
    last_waited_ = waited;
    step_ = step;
    return;
  }
  const double step_s = std::chrono::duration<double>(now - last_step_).count();
  // Waits on other threads may overlap this thread's compute: a step is never more than all
  // communication.
  const double comm_s =
      std::min(step_s, std::chrono::duration<double>(waited - last_waited_).count());
  last_step_ = now;
  last_waited_ = waited;
  step_ = step;
  samples_total_ += samples;
  compute_total_s_ += step_s - comm_s;
  communication_total_s_ += comm_s;
  ++window_steps_;
  window_samples_ += samples;
  window_communication_s_ += comm_s;
  unwritten_ = true;
  if (now - window_start_ >= options_.interval) write();
}

void ProgressReporter::write() {
  const double unix_now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string text = fmt::format(
      "step {}\nsamples_total {}\ncompute_seconds_total {:.6f}\n"
      "communication_seconds_total {:.6f}\nwindow_seconds {:.6f}\nwindow_steps {}\n"
      "window_samples {}\nwindow_communication_seconds {:.6f}\ntime_unix {:.3f}\n",
      step_, samples_total_, compute_total_s_, communication_total_s_,
      std::chrono::duration<double>(last_step_ - window_start_).count(), window_steps_,
      window_samples_, window_communication_s_, unix_now);
  const std::string tmp = path_ + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  int err = ok ? 0 : (errno != 0 ? errno : EIO);
  if (fd >= 0) ::close(fd);
  if (ok && ::rename(tmp.c_str(), path_.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    // Metrics are for watching the job, never a reason to stop it: report once and go quiet.
    DTRAIN_LOG_WARN("progress report to {} failed ({}); no more reports from this process", path_,
                    std::strerror(err));
    path_.clear();
  }
  window_start_ = last_step_;
  window_steps_ = window_samples_ = 0;
  window_communication_s_ = 0;
  unwritten_ = false;
}

}  // namespace dtrain
