#include "scheduling/simulator.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::scheduling {
namespace {

// GPUs per node of an allocation (one node id per GPU), in the order the nodes were taken.
std::vector<int> runs_of(const std::vector<int>& nodes) {
  std::vector<int> runs;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i == 0 || nodes[i] != nodes[i - 1]) runs.push_back(0);
    ++runs.back();
  }
  return runs;
}

// A tight placement of `gpus` GPUs: whole nodes, then the remainder.
std::vector<int> packed(int gpus, int per_node) {
  std::vector<int> p;
  while (gpus > 0) p.push_back(std::min(gpus, per_node)), gpus -= p.back();
  return p;
}

class Job {
 public:
  Job(const JobSpec& spec, const Application* app, const ClusterSpec& cluster)
      : spec_(spec), app_(app) {
    result_.name = spec.name;
    result_.application = spec.application;
    result_.gpus = spec.gpus;
    result_.submit = spec.submit;
    if (!app_) return;
    if (spec.batch_size > app_->max_batch_size() || spec.batch_size < app_->init_batch_size())
      throw InvalidArgumentError(fmt::format(
          "job {}: batch size {} is outside {}'s measured {}..{}", spec.name, spec.batch_size,
          app_->name(), app_->init_batch_size(), app_->max_batch_size()));
    // The oracle's time per epoch, placed tightly (what srtf knows in advance).
    const auto placement = packed(spec.gpus, cluster.gpus_per_node);
    const BatchConfig b = app_->batch_config(spec.gpus, spec.batch_size);
    if (b.atomic < 1)
      throw InvalidArgumentError(
          fmt::format("job {}: batch size {} leaves no example per GPU on {} GPUs", spec.name,
                      spec.batch_size, spec.gpus));
    for (int e = 0; e < app_->max_epochs(); ++e)
      epoch_seconds_.push_back((app_->progress_after(e + 1) - app_->progress_after(e)) /
                               goodput(placement, b, e, 1.0));
  }

  const JobSpec& spec() const { return spec_; }
  JobResult& result() { return result_; }
  bool finished() const { return result_.finish >= 0; }
  bool active(double now) const { return spec_.submit <= now && !finished(); }
  const std::vector<int>& nodes() const { return nodes_; }

  double remaining() const {
    if (!app_) return spec_.duration - progress_ + rescale_;
    const double lo = app_->progress_after(epoch_), hi = app_->progress_after(epoch_ + 1);
    double left = epoch_seconds_[epoch_] * (hi - progress_) / (hi - lo);
    for (size_t e = epoch_ + 1; e < epoch_seconds_.size(); ++e) left += epoch_seconds_[e];
    return left + rescale_;
  }

  void move_to(std::vector<int> nodes, double now, double restart_seconds) {
    nodes_ = std::move(nodes);
    placement_ = runs_of(nodes_);
    if (nodes_.empty()) return;
    if (app_) batch_ = app_->batch_config(spec_.gpus, spec_.batch_size);
    rescale_ = restart_seconds;
    if (result_.start < 0)
      result_.start = now;
    else
      ++result_.restarts;
  }

  // Runs from `now` for `seconds` where it is placed, at `speed` times its measured pace (GPU
  // model and slowdowns), its synchronization `sync_factor` times slower.
  void run(double now, double seconds, double speed, double sync_factor) {
    if (finished()) return;
    if (nodes_.empty()) {
      if (active(now + seconds)) result_.queued += now + seconds - std::max(now, spec_.submit);
      return;
    }
    const double gpus = spec_.gpus, end = now + seconds;
    const double delay = std::min(rescale_, seconds);
    double t = now + delay;
    rescale_ -= delay;
    seconds -= delay;
    while (seconds > 0 && !finished()) {
      if (!app_) {
        const double need = (spec_.duration - progress_) / speed;
        if (need > seconds) {
          progress_ += seconds * speed;
          t += seconds;
        } else {
          progress_ = spec_.duration;
          t += need;
          result_.finish = t;
        }
        seconds = 0;
        break;
      }
      const double rate = goodput(placement_, batch_, epoch_, sync_factor) * speed;
      const double next = app_->progress_after(epoch_ + 1);
      if (progress_ + rate * seconds < next) {
        progress_ += rate * seconds;
        t += seconds;
        seconds = 0;
      } else {
        // Epoch boundaries fall on whole seconds (ties to even), as in Pollux's simulator.
        const double delta = std::nearbyint((next - progress_) / rate);
        ++epoch_;
        progress_ = next;
        t += delta;
        seconds -= delta;
        if (epoch_ >= app_->max_epochs()) result_.finish = t;
      }
    }
    result_.gpu_seconds += ((finished() ? t : end) - now) * gpus;  // held until it ends
  }

 private:
  // Statistical progress per second on `placement`.
  double goodput(const std::vector<int>& placement, const BatchConfig& b, int epoch,
                 double sync_factor) const {
    StepTime st = app_->step_time(placement, b.atomic);
    const double compute = st.step - st.sync;
    st.sync *= sync_factor;
    const double step = compute + st.sync + compute * b.accum_steps;
    return app_->gain(b.total(spec_.gpus), epoch) / step;
  }

  const JobSpec& spec_;
  const Application* app_;
  JobResult result_;
  std::vector<int> nodes_, placement_;
  BatchConfig batch_;
  double rescale_ = 0;
  double progress_ = 0;  // application: statistical progress; rigid: seconds of work
  int epoch_ = 0;
  std::vector<double> epoch_seconds_;
};

}  // namespace

double SimulationResult::average_jct() const {
  double sum = 0;
  for (const auto& j : jobs) sum += j.jct();
  return jobs.empty() ? 0 : sum / jobs.size();
}

double SimulationResult::jct_percentile(double p) const {
  if (jobs.empty()) return 0;
  std::vector<double> v;
  for (const auto& j : jobs) v.push_back(j.jct());
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100 * v.size()));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

double SimulationResult::average_queueing() const {
  double sum = 0;
  for (const auto& j : jobs) sum += j.queued;
  return jobs.empty() ? 0 : sum / jobs.size();
}

[[noreturn]] static void refuse_speed(double v) {
  throw InvalidArgumentError(
      fmt::format("sched-sim: a GPU speed of {} (relative to the traces' GPUs) must be > 0", v));
}

SimulationResult simulate(const std::vector<JobSpec>& specs_in,
                          const std::map<std::string, Application>& applications,
                          const SimulationOptions& o) {
  const ClusterSpec& cluster = o.cluster;
  if (cluster.nodes <= 0 || cluster.gpus_per_node <= 0)
    throw InvalidArgumentError(
        fmt::format("sched-sim: a cluster of {} node(s) of {} GPU(s) cannot run jobs",
                    cluster.nodes, cluster.gpus_per_node));
  if (!cluster.node_speed.empty() &&
      cluster.node_speed.size() != static_cast<size_t>(cluster.nodes))
    throw InvalidArgumentError(fmt::format("sched-sim: {} node speeds for {} nodes",
                                           cluster.node_speed.size(), cluster.nodes));
  for (double v : cluster.node_speed)
    if (!(v > 0 && v < 1000)) refuse_speed(v);
  if (cluster.nodes_per_rack < 0)
    throw InvalidArgumentError(fmt::format(
        "sched-sim: {} nodes per rack; give 0 (one rack) or more", cluster.nodes_per_rack));
  auto refuse = [](const char* what, double v, const char* rule) {
    throw InvalidArgumentError(fmt::format("sched-sim: {} is {}; it must be {}", what, v, rule));
  };
  // Epoch boundaries fall on whole seconds (as in Pollux): so must intervals and restarts.
  auto whole = [](double v) { return v == std::floor(v); };
  if (!(o.interval >= 1 && whole(o.interval)))
    refuse("the interval", o.interval, "whole seconds >= 1");
  if (!(o.restart_seconds >= 0 && whole(o.restart_seconds)))
    refuse("the restart time", o.restart_seconds, "whole seconds >= 0");
  if (!(o.interference >= 0 && o.interference < 1))
    refuse("interference", o.interference, "in [0, 1)");
  if (!(o.share_slowdown >= 0 && o.share_slowdown < 1))
    refuse("the share slowdown", o.share_slowdown, "in [0, 1)");
  if (!(o.cross_rack_slowdown >= 1))
    refuse("the cross-rack slowdown", o.cross_rack_slowdown, ">= 1");
  if (!(o.auto_load > 0)) refuse("the auto load", o.auto_load, "> 0");
  if (!(o.max_seconds > 0)) refuse("the time limit", o.max_seconds, "> 0 seconds");
  if (specs_in.empty()) throw InvalidArgumentError("sched-sim: no jobs to simulate");
  // In submission order, whatever the caller's: fifo and tiresias rank by it.
  std::vector<JobSpec> specs = specs_in;
  std::stable_sort(specs.begin(), specs.end(),
                   [](const JobSpec& a, const JobSpec& b) { return a.submit < b.submit; });
  std::vector<Job> jobs;
  jobs.reserve(specs.size());
  for (const auto& s : specs) {
    if (s.gpus > cluster.total_gpus())
      throw InvalidArgumentError(fmt::format("job {} asks for {} GPUs; the cluster has {}", s.name,
                                             s.gpus, cluster.total_gpus()));
    const Application* app = nullptr;
    if (!s.application.empty()) {
      auto it = applications.find(s.application);
      if (it == applications.end())
        throw InvalidArgumentError(
            fmt::format("job {}: no traces of application '{}'", s.name, s.application));
      app = &it->second;
    }
    jobs.emplace_back(s, app, cluster);
  }
  auto policy = make_policy(o.policy, o.policy_options);
  std::set<int> holding;  // ids of the jobs the policy chose last time
  double now = 0;
  const double first_submit = specs.front().submit;
  while (std::any_of(jobs.begin(), jobs.end(), [](const Job& j) { return !j.finished(); })) {
    // Interference: nodes shared by two or more jobs that span several nodes.
    std::vector<int> spanning(cluster.nodes, 0);
    auto spans = [](const std::vector<int>& nodes) {
      return !nodes.empty() &&
             std::adjacent_find(nodes.begin(), nodes.end(), std::not_equal_to<>()) != nodes.end();
    };
    for (const auto& j : jobs)
      if (!j.finished() && spans(j.nodes()))
        for (int n : std::set<int>(j.nodes().begin(), j.nodes().end())) ++spanning[n];
    std::vector<int> sharing(cluster.nodes, 0);  // jobs per node
    for (const auto& j : jobs)
      if (!j.finished())
        for (int n : std::set<int>(j.nodes().begin(), j.nodes().end())) ++sharing[n];
    for (auto& j : jobs) {
      double network = 0, shared = 0, sync = 1, gpu = j.nodes().empty() ? 1 : INFINITY;
      for (int n : j.nodes()) {
        if (sharing[n] > 1) shared = o.share_slowdown;
        if (spans(j.nodes()) && spanning[n] > 1) network = o.interference;
        if (cluster.rack_of(n) != cluster.rack_of(j.nodes().front())) sync = o.cross_rack_slowdown;
        gpu = std::min(gpu, cluster.speed_of(n));  // synchronous: the slowest GPU sets the pace
      }
      j.run(now, o.interval, gpu * (1 - network) * (1 - shared), sync);
    }
    now += o.interval;
    if (now > o.max_seconds) {
      std::vector<std::string> left;
      for (auto& j : jobs)
        if (!j.finished()) left.push_back(j.spec().name);
      throw InvalidArgumentError(fmt::format(
          "{} job(s) unfinished after {:.0f} simulated hours ({}{}): raise the limit or check "
          "that the cluster can hold them",
          left.size(), o.max_seconds / 3600,
          fmt::join(left.begin(), left.begin() + std::min<size_t>(left.size(), 5), ", "),
          left.size() > 5 ? ", ..." : ""));
    }

    std::vector<JobView> views;
    int demand = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (!jobs[i].active(now)) continue;
      views.push_back({static_cast<int>(i), jobs[i].spec().submit, jobs[i].spec().gpus,
                       holding.contains(static_cast<int>(i)), jobs[i].remaining()});
      demand += jobs[i].spec().gpus;
    }
    const auto chosen = policy->choose(now, views, cluster.total_gpus());
    holding = std::set<int>(chosen.begin(), chosen.end());
    std::vector<int> free(cluster.nodes, cluster.gpus_per_node);
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (jobs[i].nodes().empty()) continue;
      if (holding.contains(static_cast<int>(i))) {
        for (int n : jobs[i].nodes()) --free[n];
      } else if (!jobs[i].finished()) {
        jobs[i].move_to({}, now, o.restart_seconds);  // preempted
      }
    }
    Placement how = o.placement;
    if (how == Placement::kAuto)
      how = demand >= o.auto_load * cluster.total_gpus() ? Placement::kPack : Placement::kSpread;
    for (int id : chosen) {
      Job& j = jobs[id];
      if (!j.nodes().empty()) continue;
      auto nodes = place(cluster, free, j.spec().gpus, how);
      if (nodes.empty())
        throw InternalError(fmt::format("policy {} chose job {} ({} GPUs) beyond the free GPUs",
                                        policy->name(), j.spec().name, j.spec().gpus));
      j.move_to(std::move(nodes), now, o.restart_seconds);
    }
  }

  SimulationResult r;
  r.policy = o.policy;
  r.placement = std::string(to_string(o.placement));
  double last = 0, held = 0;
  for (auto& j : jobs) {
    r.jobs.push_back(j.result());
    last = std::max(last, j.result().finish);
    held += j.result().gpu_seconds;
  }
  r.makespan = last - first_submit;
  r.utilization = r.makespan > 0 ? held / (cluster.total_gpus() * r.makespan) : 0;
  return r;
}

}  // namespace dtrain::scheduling
