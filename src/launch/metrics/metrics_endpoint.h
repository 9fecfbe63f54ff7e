// The Prometheus endpoint of `dtrain run --metrics-port P` (docs/metrics.md): what this machine's
// workers last reported through their ProgressReporter (step, samples/s, step time split into
// compute and communication, the age of the report) and the launcher's own counts (restarts),
// served as the text exposition format at http://HOST:P/metrics by prometheus-cpp's exposer.
//
// The workers write their reports into a private directory (DTRAIN_PROGRESS_DIR), one file per
// rank; a scrape reads them, so that nothing runs between scrapes and a worker never waits on
// the launcher.
#pragma once

#include <atomic>
#include <memory>
#include <string>

namespace prometheus {
class Exposer;
}

namespace dtrain::launch {

class MetricsEndpoint {
 public:
  // Serves on every interface at `port` (0: a free one, see port()). Throws InvalidArgumentError
  // when the port cannot be bound or the report directory cannot be made.
  MetricsEndpoint(int port, std::string log_prefix);
  ~MetricsEndpoint();  // stops serving; removes the report directory
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }
  // For the workers' DTRAIN_PROGRESS_DIR.
  const std::string& progress_dir() const;

  // The ranks whose reports are served: first_rank .. first_rank + count - 1.
  void set_ranks(int first_rank, int count);
  void set_restarts(int restarts);

 private:
  class Collector;
  std::shared_ptr<Collector> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace dtrain::launch
