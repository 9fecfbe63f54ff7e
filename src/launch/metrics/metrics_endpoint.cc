#include "launch/metrics/metrics_endpoint.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
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
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include "common/log.h"
#include "dtrain/error.h"
#include "launch/metrics/metrics_page.h"
#include "launch/metrics/run_history.h"

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
  void set_flight_dir(const std::string& dir) {
    std::lock_guard lock(mutex_);
    flight_dir_ = dir;
  }
  const std::string& dir() const { return dir_; }
  RunHistory::Sources sources() const {
    std::lock_guard lock(mutex_);
    return {dir_, flight_dir_, first_rank_, ranks_, restarts_};
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    int first = 0, ranks = 0, restarts = 0;
    std::string flight_dir;
    {
      std::lock_guard lock(mutex_);
      first = first_rank_;
      ranks = ranks_;
      restarts = restarts_;
      flight_dir = flight_dir_;
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
    auto calls = family("dtrain_calls_total",
                        "Calls (collectives, point to point, Horovod's) a rank completed",
                        MetricType::Counter);
    auto in_calls = family("dtrain_calls_in_progress",
                           "Calls a rank is in now: a rank that stays in one while no rank's "
                           "dtrain_calls_total grows is waiting for another",
                           MetricType::Gauge);
    auto inside = family("dtrain_seconds_in_calls_total",
                         "A rank's time inside calls since it started (to the kernel's tick)",
                         MetricType::Counter);
    for (const RankFigures& f : read_figures(dir_, flight_dir, first, ranks)) {
      const prometheus::ClientMetric::Label label{"rank", std::to_string(f.rank)};
      auto add = [&](prometheus::MetricFamily& family, double value) {
        auto& m = family.metric.emplace_back();
        m.label = {label};
        if (family.type == MetricType::Counter)
          m.counter.value = value;
        else
          m.gauge.value = value;
      };
      if (const auto& r = f.report) {
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
      if (const auto& b = f.beat) {
        add(calls, static_cast<double>(b->completed));
        add(in_calls, static_cast<double>(b->in_calls));
        add(inside, b->inside_ns * 1e-9);
      }
    }
    return {restarts_f, ranks_f,       step,       samples, rate,  step_s,   compute_s,
            comm_s,     compute_total, comm_total, age,     calls, in_calls, inside};
  }

 private:
  const std::string dir_;
  mutable std::mutex mutex_;
  int first_rank_ = 0, ranks_ = 0, restarts_ = 0;
  std::string flight_dir_;
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

struct MetricsEndpoint::Served {
  const prometheus::Collectable* collector;
  const RunHistory* history;
};

namespace {

// One request: GET /metrics is the text format, / the page, /history.json what it draws;
// anything else a short error.
MHD_Result answer(void* cls, MHD_Connection* connection, const char* url, const char* method,
                  const char*, const char*, size_t* upload_size, void**) {
  const auto& served = *static_cast<const MetricsEndpoint::Served*>(cls);
  unsigned status = MHD_HTTP_OK;
  std::string body, type = "text/plain; version=0.0.4; charset=utf-8";
  if (std::strcmp(method, "GET") != 0 && std::strcmp(method, "HEAD") != 0) {
    if (*upload_size != 0) {  // a body we do not want: swallow it, answer at its end
      *upload_size = 0;
      return MHD_YES;
    }
    status = MHD_HTTP_METHOD_NOT_ALLOWED;
    body = "only GET /metrics, / and /history.json\n";
  } else if (std::strcmp(url, "/metrics") == 0) {
    body = prometheus::TextSerializer().Serialize(served.collector->Collect());
  } else if (std::strcmp(url, "/") == 0) {
    body = metrics_page();
    type = "text/html; charset=utf-8";
  } else if (std::strcmp(url, "/history.json") == 0) {
    body = served.history->json();
    type = "application/json";
  } else {
    status = MHD_HTTP_NOT_FOUND;
    body = "not found: the metrics are at /metrics\n";
  }
  MHD_Response* response =
      MHD_create_response_from_buffer(body.size(), body.data(), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, "Content-Type", type.c_str());
  const MHD_Result queued = MHD_queue_response(connection, status, response);
  MHD_destroy_response(response);
  return queued;
}

}  // namespace

void MetricsEndpoint::StopDaemon::operator()(MHD_Daemon* d) const { MHD_stop_daemon(d); }

MetricsEndpoint::MetricsEndpoint(MetricsEndpointOptions options) {
  const int port = options.port;
  if (port < 0 || port > 65535)
    throw InvalidArgumentError(
        fmt::format("--metrics-port is {}: use 1-65535, or 0 for any free port", port));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, options.address.c_str(), &addr.sin_addr) != 1)
    throw InvalidArgumentError(
        fmt::format("--metrics-addr is '{}': give an IPv4 address of this machine (0.0.0.0: every "
                    "interface, 127.0.0.1: this machine only)",
                    options.address));
  collector_ = std::make_shared<Collector>(make_report_dir());
  collector_->set_ranks(options.first_rank, options.ranks);

  // The server's and the sampler's threads take no signals: SIGCHLD and the forwarded signals must
  // reach the launcher's signalfd (launch/supervisor.h), whichever was made first.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  history_ = std::make_unique<RunHistory>([c = collector_] { return c->sources(); });
  served_ = std::make_unique<Served>(Served{collector_.get(), history_.get()});
  daemon_.reset(MHD_start_daemon(
      MHD_USE_EPOLL_INTERNAL_THREAD, static_cast<uint16_t>(port), nullptr, nullptr, &answer,
      served_.get(), MHD_OPTION_SOCK_ADDR, &addr, MHD_OPTION_CONNECTION_TIMEOUT,
      static_cast<unsigned>(options.idle_timeout.count()), MHD_OPTION_CONNECTION_LIMIT,
      options.max_connections, MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u, MHD_OPTION_END));
  const int err = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (!daemon_) {
    std::error_code ec;
    std::filesystem::remove_all(collector_->dir(), ec);
    throw InvalidArgumentError(
        fmt::format("{}: cannot serve metrics on {}:{} ({}): is another job's launcher on it? Pick "
                    "another --metrics-port, or 0 for any free one",
                    options.log_prefix, options.address, port, std::strerror(err)));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(daemon_.get(), MHD_DAEMON_INFO_BIND_PORT);
  port_ = info != nullptr && info->port != 0 ? info->port : port;
  DTRAIN_LOG_INFO("{}: metrics at http://{}:{}/metrics (Prometheus text format)",
                  options.log_prefix, options.address, port_);
}

MetricsEndpoint::~MetricsEndpoint() {
  daemon_.reset();  // no scrape reads the directory any more
  history_.reset();
  std::error_code ec;
  std::filesystem::remove_all(collector_->dir(), ec);
}

const std::string& MetricsEndpoint::progress_dir() const { return collector_->dir(); }
void MetricsEndpoint::set_ranks(int first_rank, int count) {
  collector_->set_ranks(first_rank, count);
}
void MetricsEndpoint::set_restarts(int restarts) { collector_->set_restarts(restarts); }
void MetricsEndpoint::set_flight_dir(const std::string& dir) { collector_->set_flight_dir(dir); }

}  // namespace dtrain::launch
