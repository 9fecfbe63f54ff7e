#include "launch/metrics/metrics_endpoint.h"

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <vector>

#include <fmt/format.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>

#include "common/log.h"
#include "dtrain/error.h"
#include "launch/progress_file.h"

namespace dtrain::launch {

// Reads the reports at each scrape.
class MetricsEndpoint::Collector : public prometheus::Collectable {
 public:
  explicit Collector(std::string dir) : dir_(std::move(dir)) {}

  void set_ranks(int first, int count) {
    std::lock_guard lock(mutex_);
    first_rank_ = first;
    ranks_ = count;
  }
  void set_restarts(int restarts) {
    std::lock_guard lock(mutex_);
    restarts_ = restarts;
  }
  const std::string& dir() const { return dir_; }

  std::vector<prometheus::MetricFamily> Collect() const override {
    int first = 0, ranks = 0, restarts = 0;
    {
      std::lock_guard lock(mutex_);
      first = first_rank_;
      ranks = ranks_;
      restarts = restarts_;
    }
    using prometheus::MetricType;
    auto family = [](const char* name, const char* help, MetricType type) {
      prometheus::MetricFamily f;
      f.name = name;
      f.help = help;
      f.type = type;
      return f;
    };
    auto restarts_f =
        family("dtrain_restarts_total", "Restarts of the job after failures (elastic runs)",
               MetricType::Counter);
    restarts_f.metric.emplace_back().counter.value = restarts;
    auto ranks_f = family("dtrain_local_ranks", "Workers this launcher runs", MetricType::Gauge);
    ranks_f.metric.emplace_back().gauge.value = ranks;

    auto step = family("dtrain_step", "The last step a rank finished", MetricType::Gauge);
    auto samples = family("dtrain_samples_total", "Samples a rank trained since it started",
                          MetricType::Counter);
    auto rate = family("dtrain_samples_per_second",
                       "A rank's samples per second over its last report", MetricType::Gauge);
    auto step_s =
        family("dtrain_step_seconds", "Mean step time over the last report", MetricType::Gauge);
    auto compute_s = family("dtrain_step_compute_seconds",
                            "Mean compute per step over the last report (step time less "
                            "communication)",
                            MetricType::Gauge);
    auto comm_s = family("dtrain_step_communication_seconds",
                         "Mean exposed communication per step over the last report (time in "
                         "Work::wait)",
                         MetricType::Gauge);
    auto compute_total = family("dtrain_compute_seconds_total",
                                "A rank's compute time since it started", MetricType::Counter);
    auto comm_total =
        family("dtrain_communication_seconds_total",
               "A rank's exposed communication time since it started", MetricType::Counter);
    auto age = family("dtrain_report_age_seconds",
                      "Seconds since a rank last reported: a stuck rank's keeps growing",
                      MetricType::Gauge);
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    for (int rank = first; rank < first + ranks; ++rank) {
      const auto r = read_progress_file(dir_ + "/" + progress_file_name(rank), rank);
      if (!r) continue;  // not reported yet
      const prometheus::ClientMetric::Label label{"rank", std::to_string(rank)};
      auto add = [&](prometheus::MetricFamily& f, double value) {
        auto& m = f.metric.emplace_back();
        m.label = {label};
        if (f.type == MetricType::Counter)
          m.counter.value = value;
        else
          m.gauge.value = value;
      };
      add(step, r->step);
      add(samples, r->samples_total);
      add(compute_total, r->compute_seconds_total);
      add(comm_total, r->communication_seconds_total);
      add(age, now - r->time_unix);
      if (r->window_steps > 0 && r->window_seconds > 0) {
        const double per_step = r->window_seconds / r->window_steps;
        const double comm = r->window_communication_seconds / r->window_steps;
        add(rate, r->window_samples / r->window_seconds);
        add(step_s, per_step);
        add(compute_s, per_step - comm);
        add(comm_s, comm);
      }
    }
    return {restarts_f, ranks_f, step,          samples,    rate, step_s,
            compute_s,  comm_s,  compute_total, comm_total, age};
  }

 private:
  const std::string dir_;
  mutable std::mutex mutex_;
  int first_rank_ = 0, ranks_ = 0, restarts_ = 0;
};

namespace {

std::string make_report_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/dtrain-progress-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr)
    throw InvalidArgumentError(fmt::format(
        "dtrain run --metrics-port: cannot make a directory for the workers' reports ({}): {}; "
        "set TMPDIR to a writable directory",
        pattern, std::strerror(errno)));
  return pattern;
}

}  // namespace

MetricsEndpoint::MetricsEndpoint(int port, std::string log_prefix) {
  if (port < 0 || port > 65535)
    throw InvalidArgumentError(
        fmt::format("--metrics-port is {}: use 1-65535, or 0 for any free port", port));
  collector_ = std::make_shared<Collector>(make_report_dir());
  // The server's threads take no signals: SIGCHLD and the forwarded signals must reach the
  // launcher's signalfd (launch/supervisor.h), whichever was made first.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  try {
    // Every interface: Prometheus scrapes from another machine. One thread: scrapes are rare.
    exposer_ = std::make_unique<prometheus::Exposer>(fmt::format("0.0.0.0:{}", port), 1);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  } catch (const std::exception& e) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    std::error_code ec;
    std::filesystem::remove_all(collector_->dir(), ec);
    throw InvalidArgumentError(fmt::format(
        "{}: cannot serve metrics on port {} ({}): is another job's launcher on it? Pick "
        "another --metrics-port, or 0 for any free one",
        log_prefix, port, e.what()));
  }
  exposer_->RegisterCollectable(collector_);
  const auto ports = exposer_->GetListeningPorts();
  port_ = ports.empty() ? port : ports.front();
  DTRAIN_LOG_INFO("{}: metrics at http://0.0.0.0:{}/metrics (Prometheus text format)", log_prefix,
                  port_);
}

MetricsEndpoint::~MetricsEndpoint() {
  exposer_.reset();  // no scrape reads the directory any more
  std::error_code ec;
  std::filesystem::remove_all(collector_->dir(), ec);
}

const std::string& MetricsEndpoint::progress_dir() const { return collector_->dir(); }
void MetricsEndpoint::set_ranks(int first_rank, int count) {
  collector_->set_ranks(first_rank, count);
}
void MetricsEndpoint::set_restarts(int restarts) { collector_->set_restarts(restarts); }

}  // namespace dtrain::launch
