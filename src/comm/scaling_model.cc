#include "comm/scaling_model.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::comm {
namespace {

// Buckets of gradients become ready in order through the backward pass; each is reduced when it
// is ready and the one before it is done. Returns when the last finishes, from the step's start.
double overlapped_end(double start, double span, const std::vector<double>& costs) {
  double end = start;
  const double n = static_cast<double>(costs.size());
  for (size_t i = 0; i < costs.size(); ++i) {
    const double ready = start + span * static_cast<double>(i + 1) / n;
    end = std::max(end, ready) + costs[i];
  }
  return end;
}

std::vector<double> bucket_sizes(double bytes, double bucket) {
  std::vector<double> sizes;
  for (double left = bytes; left > 0; left -= bucket) sizes.push_back(std::min(left, bucket));
  return sizes;
}

}  // namespace

const std::vector<std::string>& step_layouts() {
  static const std::vector<std::string> layouts = {
      "ddp", "ddp-ring", "ddp-hierarchical", "ddp-recursive-doubling", "ps", "zero3", "pipeline"};
  return layouts;
}

Topology job_topology(const ClusterShape& s) {
  Topology t;
  const int hosts = (s.ranks + s.per_host - 1) / s.per_host;
  t.local = hosts == 1;
  t.level = Topology::Level::kHosts;
  t.hosts = hosts;
  t.per_host = std::min(s.per_host, s.ranks);
  t.uniform = s.ranks % s.per_host == 0;
  t.host_contiguous = true;
  if (s.hosts_per_rack > 0 && hosts > s.hosts_per_rack) {
    t.racks = (hosts + s.hosts_per_rack - 1) / s.hosts_per_rack;
    t.hosts_per_rack = s.hosts_per_rack;
    t.spans_racks = true;
  }
  if (t.per_host < 2) {
    // One rank per host: the hierarchy, where there is one, is by rack.
    t.level = Topology::Level::kRacks;
    t.hosts = t.racks;
    t.per_host = t.racks > 1 ? t.hosts_per_rack : hosts;
    t.uniform = hosts % std::max(1, t.hosts_per_rack) == 0;
  }
  return t;
}

StepPrediction predict_step(const CostModel& model, const StepModel& m, const ClusterShape& s,
                            const std::string& layout) {
  if (m.parameters <= 0 || m.compute_s <= 0)
    throw InvalidArgumentError(
        "a prediction needs the parameter count and the compute time per step");
  if (s.ranks < 1 || s.per_host < 1)
    throw InvalidArgumentError(
        fmt::format("ranks ({}) and ranks per host ({}) must be at least 1", s.ranks, s.per_host));
  StepPrediction p;
  p.layout = layout;
  p.ranks = s.ranks;
  const double M = m.parameters * m.bytes_per_gradient;
  const double backward = m.compute_s * m.backward_share;
  const double forward = m.compute_s - backward;
  const Topology t = job_topology(s);
  const int n = s.ranks;
  auto allreduce = [&](const std::string& algo, double bytes) {
    const auto b = static_cast<size_t>(bytes);
    if (algo.empty()) return model.best_cost(CollectiveKind::kAllreduce, b, n, t);
    return model.cost(algo, CollectiveKind::kAllreduce, b, n, t);
  };
  double step = m.compute_s;
  if (n == 1) {
    // Nothing to communicate.
  } else if (layout.rfind("ddp", 0) == 0) {
    const std::string algo = layout == "ddp"                            ? ""
                             : layout.substr(4) == "recursive-doubling" ? "recursive_doubling"
                                                                        : layout.substr(4);
    std::vector<double> costs;
    for (double b : bucket_sizes(M, m.bucket_bytes)) costs.push_back(allreduce(algo, b));
    for (double c : costs) p.comm_s += c;
    step = std::max(m.compute_s, overlapped_end(forward, backward, costs));
  } else if (layout == "ps") {
    if (m.ps_servers < 1)
      throw InvalidArgumentError("the ps layout needs --ps-servers S (at least 1)");
    // Each worker pushes its gradients and pulls the parameters through its host's link, shared
    // by the host's ranks; each server takes n/S of every push and serves n/S of every pull.
    // Pushes and pulls run in opposite directions at once: a bucket's push costs the busier of
    // the two links, and the last bucket's pull follows its push.
    const auto k = model.constants();
    const double busier = std::max(static_cast<double>(std::min(s.per_host, n)),
                                   static_cast<double>(n) / m.ps_servers);
    std::vector<double> costs;
    for (double b : bucket_sizes(M, m.bucket_bytes)) costs.push_back(k.alpha + b * k.beta * busier);
    for (double c : costs) p.comm_s += 2 * c;
    step = std::max(m.compute_s, overlapped_end(forward, backward, costs) + costs.back());
  } else if (layout == "zero3") {
    // Every step gathers the parameters for the forward and again for the backward, and
    // reduce-scatters the gradients: three passes of (n-1)/n of the model, each half an
    // all-reduce. The forward's gathers overlap the forward; the rest the backward.
    std::vector<double> half;
    for (double b : bucket_sizes(M, m.bucket_bytes)) half.push_back(allreduce("", b) / 2);
    double one = 0;
    for (double c : half) one += c;
    p.comm_s = 3 * one;
    const double fwd_end = overlapped_end(0, forward, half);
    std::vector<double> back = half;
    for (auto& c : back) c *= 2;  // gather, then reduce-scatter, per bucket
    step = std::max(m.compute_s, overlapped_end(std::max(forward, fwd_end), backward, back));
  } else if (layout == "pipeline") {
    const int stages = std::min(m.pipeline_stages, n);
    if (stages < 1 || m.micro_batches < 1)
      throw InvalidArgumentError(
          "the pipeline layout needs --stages and --micro-batches of at least 1");
    // Each stage holds 1/stages of the model and does 1/stages of the work of stages ranks'
    // batches; the fill and drain leave (stages-1)/(micro_batches+stages-1) of it idle.
    const double m_b = m.micro_batches, st = stages;
    const double pipe = m.compute_s * (m_b + st - 1) / m_b;
    // Activations forward and gradients back, one hop per micro-batch, on the critical path at
    // the fill and drain; stages on different hosts.
    const auto k = model.constants();
    const bool across = s.per_host < stages;
    const LinkCost hop = across ? k.host() : k.shm();
    const double p2p = 2 * (st - 1) * (hop.alpha + m.activation_bytes / m_b * hop.beta);
    // The stage's gradients all-reduced among the replicas, after the stage's last backward.
    const int replicas = n / stages;
    double sync = 0;
    if (replicas > 1) {
      ClusterShape rs{replicas, std::max(1, s.per_host / stages), s.hosts_per_rack};
      sync = model.best_cost(CollectiveKind::kAllreduce, static_cast<size_t>(M / st), replicas,
                             job_topology(rs));
    }
    p.comm_s = p2p + sync;
    step = pipe + p2p + sync;
  } else {
    throw InvalidArgumentError(
        fmt::format("no layout '{}': use one of ddp, ddp-ring, ddp-hierarchical, "
                    "ddp-recursive-doubling, ps, zero3, pipeline",
                    layout));
  }
  if (step >= 1e29) {
    // The layout cannot run on this shape (hierarchical with one host, say).
    p.runs = false;
    return p;
  }
  p.step_s = step;
  p.exposed_s = step - m.compute_s;
  p.efficiency = m.compute_s / step;
  return p;
}

}  // namespace dtrain::comm
