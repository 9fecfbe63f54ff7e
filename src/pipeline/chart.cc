#include "dtrain/pipeline/chart.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dtrain/error.h"

namespace dtrain::pipeline {
namespace {

bool is_pass(Op op) {
  return op == Op::kForward || op == Op::kBackward || op == Op::kBackwardInput ||
         op == Op::kBackwardWeight;
}

// The smallest pass, the chart's time unit.
double unit_of(const ScheduleReport& report) {
  double unit = 0;
  for (const auto& t : report.timeline) {
    const double d = t.end - t.start;
    if (is_pass(t.action.op) && d > 0 && (unit == 0 || d < unit)) unit = d;
  }
  return unit > 0 ? unit : 1;
}

const char* color_of(Op op) {
  switch (op) {
    case Op::kForward:
      return "#4e79a7";
    case Op::kBackward:
    case Op::kBackwardInput:
      return "#59a14f";
    default:
      return "#f28e2b";
  }
}

}  // namespace

std::string label(const Schedule& s, const Action& a) {
  char letter = 0;
  switch (a.op) {
    case Op::kForward:
      letter = 'F';
      break;
    case Op::kBackward:
    case Op::kBackwardInput:
      letter = 'B';
      break;
    case Op::kBackwardWeight:
      letter = 'W';
      break;
    default:
      return "";
  }
  if (s.virtual_stages > 1) return fmt::format("{}{}:{}", letter, a.microbatch, a.stage);
  return fmt::format("{}{}", letter, a.microbatch);
}

// Charts wider than this are refused: costs of very different sizes would ask for billions of
// columns.
constexpr double kMaxColumns = 100'000;

double columns_of(const ScheduleReport& report, double unit) {
  const double columns = std::ceil(report.makespan / unit - 1e-9);
  if (!(columns <= kMaxColumns))
    throw InvalidArgumentError(fmt::format(
        "pipeline chart: the timeline is {:.3g} times its shortest pass, more than {:.0f} "
        "columns; give costs of closer sizes, or print the figures only (--quiet)",
        columns, kMaxColumns));
  return columns;
}

std::string text_chart(const Schedule& s, const ScheduleReport& report) {
  const double unit = unit_of(report);
  const auto columns = static_cast<size_t>(columns_of(report, unit));
  size_t width = 1;
  for (const auto& t : report.timeline) width = std::max(width, label(s, t.action).size());
  std::vector<std::vector<std::string>> cells(s.ranks, std::vector<std::string>(columns, "."));
  for (const auto& t : report.timeline) {
    if (!is_pass(t.action.op)) continue;
    const auto first = static_cast<size_t>(std::llround(t.start / unit));
    const auto last = static_cast<size_t>(std::llround(t.end / unit));
    // A pass longer than one unit (a whole backward, B + W) is labelled once and continued
    // with dashes: "B0 --" is one backward, "B0 B0" would read as two.
    const std::string name = label(s, t.action);
    for (size_t c = first; c < last && c < columns; ++c)
      cells[t.rank][c] = c == first ? name : std::string(name.size(), '-');
  }
  std::string out;
  const int digits = static_cast<int>(fmt::format("{}", s.ranks - 1).size());
  for (int r = 0; r < s.ranks; ++r) {
    out += fmt::format("rank {:>{}} |", r, digits);
    for (const auto& c : cells[r]) out += fmt::format(" {:<{}}", c, width);
    out += "\n";
  }
  return out;
}

std::string svg_chart(const Schedule& s, const ScheduleReport& report) {
  const double unit = unit_of(report);
  columns_of(report, unit);
  const double cell = 28, row = 24, left = 60, top = 24;
  const double width = left + report.makespan / unit * cell + 10;
  const double height = top + s.ranks * row + 10;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "font-family=\"monospace\" font-size=\"11\">\n"
      "<text x=\"4\" y=\"14\">{}: {} ranks, {} micro-batches, {} stages, bubble {:.3f}</text>\n",
      width, height, s.name, s.ranks, s.microbatches, s.stages(), report.bubble);
  for (int r = 0; r < s.ranks; ++r)
    out += fmt::format("<text x=\"4\" y=\"{:.0f}\">rank {}</text>\n", top + r * row + 16, r);
  for (const auto& t : report.timeline) {
    if (!is_pass(t.action.op)) continue;
    const double x = left + t.start / unit * cell, w = (t.end - t.start) / unit * cell;
    const double y = top + t.rank * row;
    out += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\" "
        "stroke=\"white\"/><text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"white\">{}</text>\n",
        x, y, w, row - 4, color_of(t.action.op), x + 3, y + 14, label(s, t.action));
  }
  out += "</svg>\n";
  return out;
}

std::string chrome_trace(const Schedule& s, const ScheduleReport& report) {
  nlohmann::json events = nlohmann::json::array();
  for (int r = 0; r < s.ranks; ++r)
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", r},
                      {"args", {{"name", fmt::format("rank {}", r)}}}});
  for (const auto& t : report.timeline) {
    if (!is_pass(t.action.op)) continue;
    events.push_back({{"name", label(s, t.action)},
                      {"cat", std::string(to_string(t.action.op))},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", t.rank},
                      {"ts", t.start * 1000},
                      {"dur", (t.end - t.start) * 1000},
                      {"args", {{"stage", t.action.stage}, {"microbatch", t.action.microbatch}}}});
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() + "\n";
}

}  // namespace dtrain::pipeline
