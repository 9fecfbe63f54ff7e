// A training application as the scheduling simulator sees it, from measurements: how long a step
// takes on a placement of GPUs at a per-GPU batch size, and how much statistical progress one
// epoch makes at a total batch size. The data are Pollux's published traces (data/pollux/,
// docs/scheduling.md): per application, validation-BATCH.csv (one row per epoch: progress,
// iteration, metric, grad_sqr, grad_var), placements.csv (placement, local_bsz, step_time,
// sync_time, measured on up to 4 nodes of 4 GPUs) and scalability.csv (num_nodes, num_replicas,
// local_bsz, step_time, sync_time, measured on up to 16 nodes).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::scheduling {

struct StepTime {
  double step = 0;  // seconds of one step (compute and gradient synchronization)
  double sync = 0;  // of which synchronization
};

struct GradStats {
  double sqr = 0;  // squared norm of the gradient
  double var = 0;  // variance of the per-example gradient
};

// How a job runs a total batch size on some replicas: each replica computes `atomic` examples
// per micro-step, `accum_steps` micro-steps accumulated before each synchronized one.
struct BatchConfig {
  int atomic = 0;
  int accum_steps = 0;
  int total(int replicas) const { return replicas * atomic * (accum_steps + 1); }
};

class Application {
 public:
  // Limits not in the traces (applications.csv); 0 takes them from the traces.
  struct Limits {
    int max_epochs = 0;
    int init_batch_size = 0;  // the batch size the learning-rate schedule was tuned for
    int max_batch_size = 0;
    int max_local_batch_size = 0;
  };

  // Reads the traces in `dir` (named after the application). Throws InvalidArgumentError naming
  // the file and line of anything missing or malformed.
  static Application load(const std::string& dir, const Limits& limits);

  const std::string& name() const { return name_; }
  int max_epochs() const { return max_epochs_; }
  int init_batch_size() const { return init_batch_size_; }
  int max_batch_size() const { return max_batch_size_; }
  int min_local_batch_size() const { return min_local_bsz_; }
  int max_local_batch_size() const { return max_local_bsz_; }

  // The progress reached after `epoch` epochs: the least any measured batch size needed, so that
  // an epoch boundary means the same amount of learning at every batch size.
  double progress_after(int epoch) const;
  // The gradient statistics during `epoch` (0-based) at a total batch size, linear between the
  // two measured batch sizes around it.
  GradStats grad_stats(double batch_size, int epoch) const;
  // Statistical efficiency: progress per example at `batch_size` relative to init_batch_size
  // (Pollux's gain: (var + sqr) / (var / scale + sqr), scale = batch / init batch).
  double gain(double batch_size, int epoch) const;
  // One step on `placement` (GPUs per node, nodes without GPUs left out) at a per-GPU batch:
  // interpolated in the batch size on a measured placement, else piecewise-linearly over the
  // (nodes, replicas) grid of the measurements (rotations of a placement are the same).
  StepTime step_time(const std::vector<int>& placement, double local_batch) const;
  // How a job asking for `batch_size` runs on `replicas` GPUs: the per-GPU batch capped by
  // max_local_batch_size with gradient accumulation to make up the rest.
  BatchConfig batch_config(int replicas, int batch_size) const;

  struct Sample {  // one measured step
    double local_bsz, step, sync;
  };

 private:
  using Curve = std::vector<Sample>;  // sorted by local_bsz
  static StepTime along(const Curve& c, double local_bsz);
  StepTime on_grid(int nodes, int replicas, double local_bsz) const;
  std::pair<int, int> bracket(double batch_size) const;

  std::string name_;
  int max_epochs_ = 0, init_batch_size_ = 0, max_batch_size_ = 0;
  int min_local_bsz_ = 0, max_local_bsz_ = 0;
  struct Epoch {
    double progress, grad_sqr, grad_var;
  };
  std::map<int, std::vector<Epoch>> validation_;  // by total batch size
  std::map<std::string, Curve> placements_;       // by normalized placement ("1244")
  std::map<std::pair<int, int>, Curve> grid_;     // by (nodes, replicas)
};

// Every application in `traces_dir` that `applications_csv` lists (columns name, max_epochs,
// init_batch_size, max_batch_size, max_local_bsz; an empty cell takes the traces' value).
std::map<std::string, Application> load_applications(const std::string& traces_dir,
                                                     const std::string& applications_csv);

}  // namespace dtrain::scheduling
