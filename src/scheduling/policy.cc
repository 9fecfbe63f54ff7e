#include "scheduling/policy.h"

#include <algorithm>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::scheduling {
namespace {

class Fifo final : public Policy {
 public:
  std::string_view name() const override { return "fifo"; }
  std::vector<int> choose(double, const std::vector<JobView>& jobs, int total) override {
    std::vector<int> chosen;
    for (const auto& j : jobs) {  // submission order: running jobs come first
      if (j.gpus > total) break;
      chosen.push_back(j.id);
      total -= j.gpus;
    }
    return chosen;
  }
};

class Srtf final : public Policy {
 public:
  std::string_view name() const override { return "srtf"; }
  std::vector<int> choose(double, const std::vector<JobView>& jobs, int total) override {
    std::vector<const JobView*> order;
    for (const auto& j : jobs) order.push_back(&j);
    std::stable_sort(order.begin(), order.end(), [](const JobView* a, const JobView* b) {
      return a->remaining < b->remaining;
    });
    std::vector<int> chosen;
    for (const JobView* j : order)
      if (j->gpus <= total) chosen.push_back(j->id), total -= j->gpus;
    return chosen;
  }
};

class Tiresias final : public Policy {
 public:
  explicit Tiresias(const PolicyOptions& o) : demote_(o.demote_gpu_seconds) {}
  std::string_view name() const override { return "tiresias"; }

  std::vector<int> choose(double now, const std::vector<JobView>& jobs, int total) override {
    std::map<int, const JobView*> active;
    for (const auto& j : jobs) active[j.id] = &j;
    auto finished = [&](int id) { return !active.contains(id); };
    std::erase_if(first_, finished);
    std::erase_if(second_, finished);
    std::erase_if(state_, [&](const auto& kv) { return finished(kv.first); });
    for (const auto& j : jobs)
      if (!state_.contains(j.id)) state_[j.id].checked = now, first_.push_back(j.id);
    // Attained service: the time a job held GPUs since the last call, times its GPUs.
    for (const auto& j : jobs) {
      State& s = state_[j.id];
      if (s.running) s.executed += now - s.checked;
      s.checked = now;
      if (s.running && s.executed * j.gpus >= demote_) {
        if (auto it = std::find(first_.begin(), first_.end(), j.id); it != first_.end()) {
          first_.erase(it);
          second_.push_back(j.id);
        }
      }
    }
    std::vector<int> chosen;
    for (const auto* queue : {&first_, &second_})
      for (int id : *queue) {
        const bool fits = active[id]->gpus <= total;
        state_[id].running = fits;
        if (fits) chosen.push_back(id), total -= active[id]->gpus;
      }
    return chosen;
  }

 private:
  struct State {
    bool running = false;
    double executed = 0;  // seconds holding GPUs
    double checked = 0;   // when `executed` was last brought up to date
  };
  double demote_;
  std::vector<int> first_, second_;  // the two queues, in order
  std::map<int, State> state_;
};

}  // namespace

const std::vector<std::string>& policy_names() {
  static const std::vector<std::string> names{"fifo", "srtf", "tiresias"};
  return names;
}

std::unique_ptr<Policy> make_policy(std::string_view name, const PolicyOptions& options) {
  if (name == "fifo") return std::make_unique<Fifo>();
  if (name == "srtf") return std::make_unique<Srtf>();
  if (name == "tiresias") {
    if (!(options.demote_gpu_seconds > 0))
      throw InvalidArgumentError("tiresias: the demotion threshold must be positive");
    return std::make_unique<Tiresias>(options);
  }
  throw InvalidArgumentError(
      fmt::format("unknown policy '{}': {}", name, fmt::join(policy_names(), ", ")));
}

}  // namespace dtrain::scheduling
