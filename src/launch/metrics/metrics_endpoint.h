// The Prometheus endpoint of `dtrain run --metrics-port P` (docs/metrics.md): what this machine's
// workers last reported through their ProgressReporter (step, samples/s, step time split into
// compute and communication, the age of the report), the calls each rank completed and is in
// (its flight recorder's beat page), and the launcher's own counts (restarts),
// in Prometheus' text exposition format (prometheus-cpp's serializer) at http://ADDR:P/metrics,
// and at http://ADDR:P/ a page for a browser (metrics_page.h) drawn from /history.json
// (run_history.h).
//
// The port faces the network, so it is served by libmicrohttpd on one epoll thread: hundreds of
// idle, slow or garbage connections cost a descriptor each, never a thread, and each is closed
// once it has sent no whole request for `idle_timeout`; a scrape is answered meanwhile.
//
// The workers write their reports into a private directory (DTRAIN_PROGRESS_DIR), one file per
// rank; a scrape reads them, so that nothing runs between scrapes and a worker never waits on
// the launcher.
#pragma once

#include <chrono>
#include <memory>
#include <string>

struct MHD_Daemon;

namespace dtrain::launch {

class RunHistory;

struct MetricsEndpointOptions {
  int port = 0;                     // 0: a free one (see MetricsEndpoint::port())
  std::string address = "0.0.0.0";  // the interface to listen on (--metrics-addr)
  // A connection that has not sent a whole request within this is closed.
  std::chrono::seconds idle_timeout{5};
  unsigned max_connections = 1000;  // open at once; more are refused at accept
  std::string log_prefix = "dtrain run";
  // The ranks served from the first scrape on, where the launcher knows them at its start (an
  // elastic run learns them each round: set_ranks).
  int first_rank = 0;
  int ranks = 0;
};

class MetricsEndpoint {
 public:
  // Throws InvalidArgumentError when the address or port cannot be bound, or the report directory
  // cannot be made.
  explicit MetricsEndpoint(MetricsEndpointOptions options);
  ~MetricsEndpoint();  // stops serving; removes the report directory
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }
  // For the workers' DTRAIN_PROGRESS_DIR.
  const std::string& progress_dir() const;

  // The ranks whose reports are served: first_rank .. first_rank + count - 1.
  void set_ranks(int first_rank, int count);
  void set_restarts(int restarts);
  // The workers' DTRAIN_FLIGHT_DIR: their flight recorders' beat pages, served as calls completed
  // and in progress per rank (what `dtrain top` tells a stuck job by).
  void set_flight_dir(const std::string& dir);

  struct Served;  // what a request may read (the collector and the run's history): internal

 private:
  class Collector;
  struct StopDaemon {
    void operator()(MHD_Daemon* d) const;
  };
  std::shared_ptr<Collector> collector_;
  std::unique_ptr<RunHistory> history_;
  std::unique_ptr<Served> served_;
  std::unique_ptr<MHD_Daemon, StopDaemon> daemon_;  // last: stopped before the rest goes
  int port_ = 0;
};

}  // namespace dtrain::launch
