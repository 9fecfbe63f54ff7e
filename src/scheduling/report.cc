#include "scheduling/report.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace dtrain::scheduling {
namespace {

std::string label(const SimulationResult& r) { return r.policy + "/" + r.placement; }

std::string duration(double s) {
  if (s >= 3600) return fmt::format("{:.2f} h", s / 3600);
  return fmt::format("{:.0f} s", s);
}

}  // namespace

std::string format_table(const std::vector<SimulationResult>& results) {
  std::string out =
      fmt::format("{:<18} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6} {:>9} {:>8}\n",
                  "policy/placement", "jobs", "avg JCT", "p50 JCT", "p95 JCT", "p99 JCT",
                  "makespan", "util", "avg queue", "restarts");
  for (const auto& r : results) {
    int restarts = 0;
    for (const auto& j : r.jobs) restarts += j.restarts;
    out += fmt::format("{:<18} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>5.0f}% {:>9} {:>8}\n",
                       label(r), r.jobs.size(), duration(r.average_jct()),
                       duration(r.jct_percentile(50)), duration(r.jct_percentile(95)),
                       duration(r.jct_percentile(99)), duration(r.makespan), 100 * r.utilization,
                       duration(r.average_queueing()), restarts);
  }
  return out;
}

std::string to_json(const std::vector<SimulationResult>& results) {
  auto all = nlohmann::json::array();
  for (const auto& r : results) {
    auto jobs = nlohmann::json::array();
    for (const auto& j : r.jobs)
      jobs.push_back({{"name", j.name},
                      {"application", j.application},
                      {"gpus", j.gpus},
                      {"submit", j.submit},
                      {"start", j.start},
                      {"finish", j.finish},
                      {"jct", j.jct()},
                      {"queued", j.queued},
                      {"gpu_seconds", j.gpu_seconds},
                      {"restarts", j.restarts}});
    all.push_back({{"policy", r.policy},
                   {"placement", r.placement},
                   {"average_jct", r.average_jct()},
                   {"p50_jct", r.jct_percentile(50)},
                   {"p95_jct", r.jct_percentile(95)},
                   {"p99_jct", r.jct_percentile(99)},
                   {"makespan", r.makespan},
                   {"utilization", r.utilization},
                   {"average_queueing", r.average_queueing()},
                   {"jobs", jobs}});
  }
  return all.dump(2) + "\n";
}

std::string svg_jct_cdf(const std::vector<SimulationResult>& results) {
  static const char* colors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                 "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
  const double w = 640, h = 400, left = 60, right = 170, top = 20, bottom = 50;
  double lo = INFINITY, hi = 0;
  for (const auto& r : results)
    for (const auto& j : r.jobs)
      lo = std::min(lo, std::max(1.0, j.jct())), hi = std::max(hi, j.jct());
  if (!(hi > lo)) hi = lo * 10;
  const double l0 = std::floor(std::log10(lo)), l1 = std::ceil(std::log10(hi));
  auto x = [&](double s) {
    return left + (std::log10(std::max(1.0, s)) - l0) / (l1 - l0) * (w - left - right);
  };
  auto y = [&](double f) { return top + (1 - f) * (h - top - bottom); };
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
      "fill=\"white\"/>\n",
      w, h);
  for (double e = l0; e <= l1; ++e)
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4}</text>\n",
        x(std::pow(10, e)), y(0), y(1), y(0) + 16,
        e < 4 ? fmt::format("{:.0f} s", std::pow(10, e)) : fmt::format("1e{:.0f} s", e));
  for (double f = 0; f <= 1.001; f += 0.25)
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{3:.1f}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:.0f}%</text>\n",
        x(std::pow(10, l0)), y(f), x(std::pow(10, l1)), left - 6, y(f) + 4, 100 * f);
  out += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">job completion time (log)</text>\n",
      (left + w - right) / 2, h - 10);
  for (size_t i = 0; i < results.size(); ++i) {
    std::vector<double> v;
    for (const auto& j : results[i].jobs) v.push_back(j.jct());
    std::sort(v.begin(), v.end());
    std::string points;
    for (size_t k = 0; k < v.size(); ++k)
      points += fmt::format("{:.1f},{:.1f} {:.1f},{:.1f} ", x(v[k]), y(double(k) / v.size()),
                            x(v[k]), y(double(k + 1) / v.size()));
    const char* c = colors[i % std::size(colors)];
    out += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n",
                       c, points);
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"{3}\" "
        "stroke-width=\"3\"/><text x=\"{4:.1f}\" y=\"{5:.1f}\">{6}</text>\n",
        w - right + 10, top + 10 + 18 * i, w - right + 30, c, w - right + 36, top + 14 + 18 * i,
        label(results[i]));
  }
  return out + "</svg>\n";
}

}  // namespace dtrain::scheduling
