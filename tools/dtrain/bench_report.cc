// The tables and JSON lines of `dtrain bench`, and how several rounds combine into one row.
#include "tools/dtrain/bench_report.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::tools {
namespace {

using bench::Collective;
using bench::Result;

std::string format_us(double us) {
  if (us <= 0) return "-";
  return us >= 1e5 ? fmt::format("{:.0f}", us) : fmt::format("{:.1f}", us);
}

// One implementation at one size over the rounds of a run (one entry without --rounds).
using RoundResults = std::map<int, const Result*>;  // round -> result

// The row shown for several rounds: each number the median of the rounds' (each already a
// median over the timed iterations), #wrong their sum.
Result combine(const RoundResults& rounds) {
  const Result& first = *rounds.begin()->second;
  Result c = first;
  std::vector<double> time, p99, cpu, bound;
  int64_t wrong = -1;
  for (const auto& [round, r] : rounds) {
    time.push_back(r->time_us);
    p99.push_back(r->p99_us);
    if (r->wait_cpu_us >= 0) cpu.push_back(r->wait_cpu_us);
    if (r->bound_fraction >= 0) bound.push_back(r->bound_fraction);
    if (r->wrong >= 0) wrong = std::max<int64_t>(wrong, 0) + r->wrong;
  }
  c.time_us = bench::median(time);
  c.p99_us = bench::median(p99);
  if (c.time_us > 0) {  // bandwidths scale with 1/time, by the factors of the first round
    c.algbw_gbs = first.algbw_gbs * first.time_us / c.time_us;
    c.busbw_gbs = first.busbw_gbs * first.time_us / c.time_us;
  }
  c.wrong = wrong;
  c.wait_cpu_us = cpu.empty() ? -1 : bench::median(cpu);
  c.bound_fraction = bound.empty() ? -1 : bench::median(bound);
  c.round = 0;
  return c;
}

// theirs/ours of each round both ran: the median, the lowest and the highest.
struct Ratio {
  double median = 0, low = 0, high = 0;
  bool valid = false;
};
Ratio ratio_over_rounds(const RoundResults& ours, const RoundResults& theirs) {
  std::vector<double> v;
  for (const auto& [round, r] : ours) {
    auto it = theirs.find(round);
    if (it != theirs.end() && r->time_us > 0 && it->second->time_us > 0)
      v.push_back(it->second->time_us / r->time_us);
  }
  if (v.empty()) return {};
  return {bench::median(v), *std::min_element(v.begin(), v.end()),
          *std::max_element(v.begin(), v.end()), true};
}

}  // namespace

void print_tables(const Plan& p, const std::vector<Result>& results,
                  const std::vector<std::string>& peers, int rounds, std::FILE* out) {
  const bool several = rounds > 1;
  for (Collective c : p.collectives) {
    const std::string coll(bench::to_string(c));
    std::map<std::string, std::map<size_t, RoundResults>> by_impl;  // impl -> bytes -> rounds
    std::set<size_t> sizes;
    int np = 0;
    for (const auto& r : results) {
      if (r.coll != coll) continue;
      by_impl[r.impl][r.bytes][r.round] = &r;
      sizes.insert(r.bytes);
      np = r.np;
    }
    if (sizes.empty()) {
      fmt::print(out, "# {}: no results\n\n", coll);
      continue;
    }
    fmt::print(
        out, "# {}  np {}  dtype {}  op {}  (time: median us over the slowest rank; p99 us{})\n",
        coll, np, bench::to_string(p.dtype),
        bench::is_reduction(c) ? bench::to_string(p.op) : "none",
        several ? fmt::format("; the median of {} rounds, each implementation once per round; "
                              "ratio: the median of the rounds' ratios [lowest-highest]",
                              rounds)
                : "");
    std::string header = fmt::format(
        "{:>12} {:>12} {:>5} {:>5} {:>11} {:>11} {:>8} {:>8} {:>7} {:>18}", "size(B)", "count",
        "type", "op", "time(us)", "p99(us)", "algbw", "busbw", "#wrong", "algo");
    if (several) header += fmt::format(" {:>17}", "rounds(us)");
    const bool cpu = p.straggle_ms > 0;
    if (cpu) header += fmt::format(" {:>11}", "cpu/op(us)");
    // --bound: the machine's own limit for dtrain's algorithm over the time measured.
    const bool bound = std::any_of(results.begin(), results.end(), [&](const Result& r) {
      return r.coll == coll && r.bound_fraction >= 0;
    });
    if (bound) header += fmt::format(" {:>6}", "bound");
    for (const auto& peer : peers) {
      header += fmt::format(" {:>14}", peer + ":ratio");
      if (several) header += fmt::format(" {:>11}", "[range]");
      header += fmt::format(" {:>11}", peer + "(us)");
      if (cpu) header += fmt::format(" {:>11}", peer + ":cpu");
    }
    fmt::print(out, "{}\n", header);
    auto cpu_text = [](const std::optional<Result>& x) {
      return x && x->wait_cpu_us >= 0 ? format_us(x->wait_cpu_us) : std::string("-");
    };
    const auto& ours = by_impl["dtrain"];
    for (size_t bytes : sizes) {
      std::optional<Result> r;
      if (ours.count(bytes)) r = combine(ours.at(bytes));
      std::optional<Result> any = r;
      for (const auto& peer : peers)
        if (!any && by_impl[peer].count(bytes)) any = combine(by_impl[peer].at(bytes));
      std::string line =
          fmt::format("{:>12} {:>12} {:>5} {:>5} ", bytes, any->count, any->dtype, any->op);
      if (r) {
        line += fmt::format("{:>11} {:>11} {:>8.3f} {:>8.3f} {:>7} {:>18}", format_us(r->time_us),
                            format_us(r->p99_us), r->algbw_gbs, r->busbw_gbs,
                            r->wrong < 0 ? std::string("-") : std::to_string(r->wrong), r->algo);
      } else {
        line += fmt::format("{:>11} {:>11} {:>8} {:>8} {:>7} {:>18}", "-", "-", "-", "-", "-", "-");
      }
      if (several) {
        std::string range = "-";
        if (r) {
          std::vector<double> t;
          for (const auto& [round, x] : ours.at(bytes)) t.push_back(x->time_us);
          range = format_us(*std::min_element(t.begin(), t.end())) + "-" +
                  format_us(*std::max_element(t.begin(), t.end()));
        }
        line += fmt::format(" {:>17}", range);
      }
      if (cpu) line += fmt::format(" {:>11}", cpu_text(r));
      if (bound)
        line += fmt::format(" {:>6}", r && r->bound_fraction >= 0
                                          ? fmt::format("{:.0f}%", 100 * r->bound_fraction)
                                          : std::string("-"));
      for (const auto& peer : peers) {
        const auto& theirs = by_impl[peer];
        if (!theirs.count(bytes)) {
          line += fmt::format(" {:>14}", "-");
          if (several) line += fmt::format(" {:>11}", "-");
          line += fmt::format(" {:>11}", "-");
          if (cpu) line += fmt::format(" {:>11}", "-");
          continue;
        }
        const Result q = combine(theirs.at(bytes));
        const Ratio ratio = r ? ratio_over_rounds(ours.at(bytes), theirs.at(bytes)) : Ratio{};
        line += fmt::format(" {:>14}", ratio.valid ? fmt::format("{:.2f}", ratio.median) : "-");
        if (several)
          line += fmt::format(
              " {:>11}", ratio.valid ? fmt::format("[{:.2f}-{:.2f}]", ratio.low, ratio.high) : "-");
        std::string time = format_us(q.time_us);
        if (q.wrong > 0) time += "!";  // that peer's results were wrong
        line += fmt::format(" {:>11}", time);
        if (cpu) line += fmt::format(" {:>11}", cpu_text(q));
      }
      fmt::print(out, "{}\n", line);
    }
    fmt::print(out, "\n");
  }
  std::fflush(out);
}

void write_json(const std::string& path, const std::vector<Result>& results) {
  std::ofstream f(path, std::ios::trunc);
  if (!f) throw InvalidArgumentError(fmt::format("dtrain bench: cannot write --json {}", path));
  for (const auto& r : results) f << bench::to_json_line(r) << "\n";
  if (!f) throw InvalidArgumentError(fmt::format("dtrain bench: writing --json {} failed", path));
}

}  // namespace dtrain::tools
