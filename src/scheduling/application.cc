#include "scheduling/application.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "dtrain/error.h"
#include "scheduling/csv_table.h"

namespace dtrain::scheduling {
namespace fs = std::filesystem;
namespace {

// A placement's name in placements.csv: its GPU counts as digits, rotated to the smallest
// (a ring of nodes measures the same from any starting node). "" when a count has two digits.
std::string placement_id(const std::vector<int>& placement) {
  std::string digits;
  for (int g : placement) {
    if (g <= 0) continue;
    if (g > 9) return "";
    digits += static_cast<char>('0' + g);
  }
  std::string best = digits;
  for (size_t i = 1; i < digits.size(); ++i)
    best = std::min(best, digits.substr(i) + digits.substr(0, i));
  return best;
}

int ceil_div(double a, double b) { return static_cast<int>(std::ceil(a / b - 1e-8)); }

// A measured step: a per-GPU batch that fits an int, a positive step time, a sync time within it.
Application::Sample sample_at(const CsvTable& t, size_t row, size_t batch, size_t step,
                              size_t sync) {
  const Application::Sample s{t.number(row, batch), t.number(row, step), t.number(row, sync)};
  if (!(s.local_bsz >= 1 && s.local_bsz <= 1e7 && s.step > 0 && s.step <= 1e6 && s.sync >= 0 &&
        s.sync <= s.step))
    throw InvalidArgumentError(fmt::format(
        "{}: needs 1 <= local_bsz <= 1e7, 0 < step_time <= 1e6 s and 0 <= sync_time <= step_time",
        t.where(row)));
  return s;
}

}  // namespace

Application Application::load(const std::string& dir, const Limits& limits) {
  Application app;
  app.name_ = fs::path(dir).filename().string();
  if (!fs::is_directory(dir))
    throw InvalidArgumentError(fmt::format("application '{}': no directory {}", app.name_, dir));
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    if (!file.starts_with("validation-") || !file.ends_with(".csv")) continue;
    const std::string digits = file.substr(11, file.size() - 15);
    int batch = 0;
    if (!digits.empty() && digits.size() <= 7 &&
        digits.find_first_not_of("0123456789") == std::string::npos)
      batch = std::stoi(digits);
    if (batch <= 0)
      throw InvalidArgumentError(fmt::format(
          "{}: the name should be validation-BATCH.csv with a batch size", entry.path().string()));
    auto t = CsvTable::read(entry.path().string());
    const size_t progress = t.column("progress"), sqr = t.column("grad_sqr"),
                 var = t.column("grad_var");
    auto& epochs = app.validation_[batch];
    for (size_t r = 0; r < t.rows(); ++r) {
      const Epoch e{t.number(r, progress), t.number(r, sqr), t.number(r, var)};
      // Progress grows every epoch, and the gain's formula needs a gradient that is not all zero.
      if (!(e.progress > (epochs.empty() ? 0 : epochs.back().progress) && e.grad_sqr >= 0 &&
            e.grad_var >= 0 && e.grad_sqr + e.grad_var > 0))
        throw InvalidArgumentError(fmt::format(
            "{}: needs progress above the previous epoch's and grad_sqr, grad_var >= 0, not both 0",
            t.where(r)));
      epochs.push_back(e);
    }
    if (epochs.empty()) throw InvalidArgumentError(fmt::format("{} has no epochs", t.path()));
  }
  if (app.validation_.empty())
    throw InvalidArgumentError(
        fmt::format("application '{}': no validation-BATCH.csv in {}", app.name_, dir));

  // Measured placements: averaged over repeats into a curve per placement and per
  // (nodes, replicas) cell of the grid.
  std::map<std::pair<int, int>, std::map<double, std::pair<Sample, int>>> cells;
  {
    auto t = CsvTable::read((fs::path(dir) / "placements.csv").string());
    const size_t p = t.column("placement"), b = t.column("local_bsz"), s = t.column("step_time"),
                 y = t.column("sync_time");
    for (size_t r = 0; r < t.rows(); ++r) {
      const std::string& id = t.text(r, p);
      if (id.empty() || id.find_first_not_of("123456789") != std::string::npos)
        throw InvalidArgumentError(fmt::format(
            "{}: placement '{}' should be GPUs per node as digits 1-9 (\"24\": 2 and 4)",
            t.where(r), id));
      const Sample sample = sample_at(t, r, b, s, y);
      std::vector<int> counts;
      for (char c : id) counts.push_back(c - '0');
      app.placements_[placement_id(counts)].push_back(sample);
      int replicas = 0;
      for (int c : counts) replicas += c;
      auto& [sum, n] = cells[{static_cast<int>(counts.size()), replicas}][sample.local_bsz];
      sum = {sample.local_bsz, sum.step + sample.step, sum.sync + sample.sync};
      ++n;
      app.min_local_bsz_ = app.min_local_bsz_ == 0
                               ? static_cast<int>(sample.local_bsz)
                               : std::min(app.min_local_bsz_, static_cast<int>(sample.local_bsz));
      app.max_local_bsz_ = std::max(app.max_local_bsz_, static_cast<int>(sample.local_bsz));
    }
    if (app.placements_.empty())
      throw InvalidArgumentError(fmt::format("{} has no rows", t.path()));
  }
  for (auto& [cell, samples] : cells)
    for (auto& [bsz, sum_n] : samples)
      app.grid_[cell].push_back(
          {bsz, sum_n.first.step / sum_n.second, sum_n.first.sync / sum_n.second});
  {
    auto t = CsvTable::read((fs::path(dir) / "scalability.csv").string());
    const size_t n = t.column("num_nodes"), r = t.column("num_replicas"), b = t.column("local_bsz"),
                 s = t.column("step_time"), y = t.column("sync_time");
    for (size_t row = 0; row < t.rows(); ++row) {
      const auto nodes = t.integer(row, n), replicas = t.integer(row, r);
      if (nodes <= 0 || replicas < nodes || replicas > 1'000'000)
        throw InvalidArgumentError(
            fmt::format("{}: needs 0 < num_nodes <= num_replicas <= 1000000", t.where(row)));
      app.grid_[{static_cast<int>(nodes), static_cast<int>(replicas)}].push_back(
          sample_at(t, row, b, s, y));
    }
  }
  auto by_batch = [](const Sample& a, const Sample& b) { return a.local_bsz < b.local_bsz; };
  for (auto& [id, curve] : app.placements_) std::stable_sort(curve.begin(), curve.end(), by_batch);
  for (auto& [cell, curve] : app.grid_) std::stable_sort(curve.begin(), curve.end(), by_batch);

  app.init_batch_size_ =
      limits.init_batch_size ? limits.init_batch_size : app.validation_.begin()->first;
  app.max_batch_size_ =
      limits.max_batch_size ? limits.max_batch_size : app.validation_.rbegin()->first;
  if (limits.max_local_batch_size) app.max_local_bsz_ = limits.max_local_batch_size;
  size_t fewest = SIZE_MAX;
  for (const auto& [batch, epochs] : app.validation_) fewest = std::min(fewest, epochs.size());
  app.max_epochs_ = limits.max_epochs ? limits.max_epochs : static_cast<int>(fewest);
  if (app.max_epochs_ <= 0 || static_cast<size_t>(app.max_epochs_) > fewest)
    throw InvalidArgumentError(
        fmt::format("application '{}': max_epochs {} but its validation files have {} epoch(s)",
                    app.name_, app.max_epochs_, fewest));
  if (app.max_batch_size_ < app.min_local_bsz_ || app.max_local_bsz_ < app.min_local_bsz_)
    throw InvalidArgumentError(fmt::format(
        "application '{}': max_batch_size {} and max_local_bsz {} must be at least the smallest "
        "measured local batch {}",
        app.name_, app.max_batch_size_, app.max_local_bsz_, app.min_local_bsz_));
  return app;
}

double Application::progress_after(int epoch) const {
  if (epoch <= 0) return 0;
  double least = INFINITY;
  for (const auto& [batch, epochs] : validation_)
    least = std::min(least, epochs.at(epoch - 1).progress);
  return least;
}

std::pair<int, int> Application::bracket(double batch_size) const {
  auto hi = validation_.lower_bound(static_cast<int>(std::ceil(batch_size)));
  if (batch_size < validation_.begin()->first || hi == validation_.end())
    throw InvalidArgumentError(
        fmt::format("application '{}': batch size {} is outside the measured {}..{}", name_,
                    batch_size, validation_.begin()->first, validation_.rbegin()->first));
  if (hi->first == batch_size) return {hi->first, hi->first};
  auto lo = std::prev(hi);
  return {lo->first, hi->first};
}

GradStats Application::grad_stats(double batch_size, int epoch) const {
  const auto [lo, hi] = bracket(batch_size);
  const Epoch& a = validation_.at(lo).at(epoch);
  const Epoch& b = validation_.at(hi).at(epoch);
  if (lo == hi) return {a.grad_sqr, a.grad_var};
  const double w = (batch_size - lo) / (hi - lo);
  return {a.grad_sqr + w * (b.grad_sqr - a.grad_sqr), a.grad_var + w * (b.grad_var - a.grad_var)};
}

double Application::gain(double batch_size, int epoch) const {
  const GradStats g = grad_stats(batch_size, epoch);
  const double scale = batch_size / init_batch_size_;
  return (g.var + g.sqr) / (g.var / scale + g.sqr);
}

StepTime Application::along(const Curve& c, double local_bsz) {
  // Outside the measured batches the nearest measurement holds (the job asks for a batch the
  // traces did not reach; a straight line would soon give negative times).
  if (local_bsz <= c.front().local_bsz) return {c.front().step, c.front().sync};
  if (local_bsz >= c.back().local_bsz) return {c.back().step, c.back().sync};
  auto hi = std::lower_bound(c.begin(), c.end(), local_bsz,
                             [](const Sample& s, double v) { return s.local_bsz < v; });
  if (hi->local_bsz == local_bsz) return {hi->step, hi->sync};
  auto lo = std::prev(hi);
  const double w = (local_bsz - lo->local_bsz) / (hi->local_bsz - lo->local_bsz);
  return {lo->step + w * (hi->step - lo->step), lo->sync + w * (hi->sync - lo->sync)};
}

StepTime Application::on_grid(int nodes, int replicas, double local_bsz) const {
  // At one node count: linear between the measured replica counts around `replicas`.
  auto at = [&](int level) -> std::optional<StepTime> {
    auto lo = grid_.end(), hi = grid_.end();
    for (auto it = grid_.lower_bound({level, 0}); it != grid_.end() && it->first.first == level;
         ++it) {
      if (it->first.second <= replicas) lo = it;
      if (it->first.second >= replicas) {
        hi = it;
        break;
      }
    }
    if (lo == grid_.end() || hi == grid_.end()) return std::nullopt;
    const StepTime a = along(lo->second, local_bsz), b = along(hi->second, local_bsz);
    if (lo == hi) return a;
    const double w = double(replicas - lo->first.second) / (hi->first.second - lo->first.second);
    return StepTime{a.step + w * (b.step - a.step), a.sync + w * (b.sync - a.sync)};
  };
  std::optional<StepTime> below, above;
  int below_nodes = 0, above_nodes = 0;
  for (const auto& [cell, curve] : grid_) {
    const int level = cell.first;
    if (level <= nodes && level != below_nodes) {
      if (auto t = at(level)) below = t, below_nodes = level;
    }
    if (level >= nodes && !above) {
      if (auto t = at(level)) above = t, above_nodes = level;
    }
  }
  if (below && above && below_nodes != above_nodes) {
    const double w = double(nodes - below_nodes) / (above_nodes - below_nodes);
    return {below->step + w * (above->step - below->step),
            below->sync + w * (above->sync - below->sync)};
  }
  if (below) return *below;
  if (above) return *above;
  throw InvalidArgumentError(fmt::format(
      "application '{}': no measurement near {} GPUs on {} nodes", name_, replicas, nodes));
}

StepTime Application::step_time(const std::vector<int>& placement, double local_batch) const {
  const std::string id = placement_id(placement);
  if (auto it = placements_.find(id); !id.empty() && it != placements_.end())
    return along(it->second, local_batch);
  int nodes = 0, replicas = 0;
  for (int g : placement)
    if (g > 0) ++nodes, replicas += g;
  // Beyond the largest measured node count, the largest one stands in (as in Pollux).
  const int most = std::prev(grid_.end())->first.first;
  return on_grid(std::min(nodes, most), replicas, local_batch);
}

BatchConfig Application::batch_config(int replicas, int batch_size) const {
  const int local = ceil_div(batch_size, replicas);
  BatchConfig c;
  c.accum_steps = ceil_div(local, max_local_bsz_) - 1;
  // One GPU asked for more than the tuned batch accumulates at least once (as measured).
  if (replicas == 1 && batch_size > init_batch_size_) c.accum_steps = std::max(1, c.accum_steps);
  c.atomic = ceil_div(local, c.accum_steps + 1);
  c.atomic = std::min(c.atomic, max_batch_size_ / (replicas * (c.accum_steps + 1)));
  return c;
}

std::map<std::string, Application> load_applications(const std::string& traces_dir,
                                                     const std::string& applications_csv) {
  auto t = CsvTable::read(applications_csv);
  const size_t name = t.column("name");
  auto optional_int = [&](size_t row, const char* column) -> int {
    if (!t.has_column(column)) return 0;
    const size_t c = t.column(column);
    if (t.text(row, c).empty()) return 0;
    const int64_t v = t.integer(row, c);
    if (v <= 0 || v > (1 << 30))
      throw InvalidArgumentError(
          fmt::format("{}: {} {} must be positive", t.where(row), column, v));
    return static_cast<int>(v);
  };
  std::map<std::string, Application> apps;
  for (size_t r = 0; r < t.rows(); ++r) {
    Application::Limits limits;
    limits.max_epochs = optional_int(r, "max_epochs");
    limits.init_batch_size = optional_int(r, "init_batch_size");
    limits.max_batch_size = optional_int(r, "max_batch_size");
    limits.max_local_batch_size = optional_int(r, "max_local_bsz");
    const std::string& n = t.text(r, name);
    apps.emplace(n, Application::load((fs::path(traces_dir) / n).string(), limits));
  }
  if (apps.empty())
    throw InvalidArgumentError(fmt::format("{} lists no application", applications_csv));
  return apps;
}

}  // namespace dtrain::scheduling
