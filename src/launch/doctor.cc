#include "launch/doctor.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "comm/flight_recorder.h"
#include "common/python_library.h"
#include "dtrain/error.h"

namespace dtrain::launch {
namespace {

using nlohmann::json;

// How long a rank must have waited for others before the doctor names them (see find_absent).
constexpr double kNotableWait = 1.0;

std::string ranks_text(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

RankRecord parse(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgumentError(fmt::format("dtrain doctor: cannot open {}", path));
  RankRecord r;
  r.path = path;
  try {
    const json j = json::parse(in);
    if (j.value("format", "") != "dtrain-flight-1")
      throw InvalidArgumentError(
          fmt::format("dtrain doctor: {} is not a dtrain flight record (format {}, expected "
                      "dtrain-flight-1)",
                      path, j.value("format", "missing")));
    r.rank = j.at("rank").get<int>();
    r.world_size = j.value("world_size", 0);
    r.pid = j.value("pid", 0);
    r.host = j.value("host", "");
    r.reason = j.value("reason", "");
    r.time = j.value("time", 0.0);
    r.python_stacks = j.value("python_stacks", "");
    for (const auto& c : j.at("calls")) {
      RecordedCall call;
      call.kind = c.at("kind").get<std::string>();
      call.group = c.at("group").get<std::string>();
      call.name = c.value("name", "");
      call.seq = c.at("seq").get<uint32_t>();
      call.op = c.value("op", "");
      call.call = c.value("call", "");
      call.state = c.at("state").get<std::string>();
      call.peer = c.value("peer", -1);
      call.tag = c.value("tag", 0);
      call.thread = c.value("thread", 0);
      call.enqueued = c.value("enqueued", 0.0);
      if (c.contains("started") && !c["started"].is_null()) call.started = c["started"];
      if (c.contains("ended") && !c["ended"].is_null()) call.ended = c["ended"];
      call.caller = c.value("caller", "");
      call.python = c.value("python", "");
      r.calls.push_back(std::move(call));
    }
    for (const auto& t : j.value("threads", json::array()))
      r.threads.push_back(
          {t.value("tid", 0), t.value("name", ""), t.value("stack", std::vector<std::string>{})});
    for (const auto& g : j.value("groups", json::array())) r.groups.push_back(g);
  } catch (const json::exception& e) {
    throw InvalidArgumentError(fmt::format(
        "dtrain doctor: {} is not a whole flight record ({}); was it cut short?", path, e.what()));
  }
  return r;
}

// The innermost frame of the program's own code in each Python thread ("worker.py:30 in step"),
// the main thread first.
std::vector<std::string> python_tops(const std::string& stacks) {
  std::vector<std::string> tops, main;
  std::istringstream in(stacks);
  std::string line, top;
  bool is_main = false;
  bool top_is_library = false;
  auto flush = [&] {
    if (!top.empty()) (is_main ? main : tops).push_back(top);
    top.clear();
    is_main = false;
  };
  while (std::getline(in, line)) {
    if (line.rfind("Thread ", 0) == 0 || line.rfind("Current thread ", 0) == 0) {
      flush();
    } else if (line.rfind("  File \"", 0) == 0) {
      // '  File "/x/worker.py", line 30 in step'
      const auto q = line.find('"', 8);
      const std::string path = line.substr(8, q == std::string::npos ? 0 : q - 8);
      const std::string file = path.substr(path.rfind('/') + 1);
      const auto l = line.find("line ");
      const std::string rest = l == std::string::npos ? "" : line.substr(l + 5);
      const auto sp = rest.find(' ');
      const std::string where = fmt::format("{}:{}{}", file, rest.substr(0, sp),
                                            sp == std::string::npos ? "" : rest.substr(sp));
      if (top.empty() || (top_is_library && !is_python_library_file(path))) {
        top = where;
        top_is_library = is_python_library_file(path);
      }
      if (line.find(" in <module>") != std::string::npos) is_main = true;
    }
  }
  flush();
  main.insert(main.end(), tops.begin(), tops.end());
  return main;
}

std::vector<std::string> cpp_frames(const RecordedThread& t, size_t n) {
  return {t.stack.begin(), t.stack.begin() + std::min(n, t.stack.size())};
}

// Where a rank is now: its Python threads' innermost frames, else the C++ frames of the thread
// that made its last call.
std::string whereabouts(const RankRecord& r, int tid) {
  if (!r.python_stacks.empty()) {
    auto tops = python_tops(r.python_stacks);
    if (tops.size() > 3) tops.resize(3);
    if (!tops.empty()) return fmt::format("Python at {}", fmt::join(tops, "; "));
  }
  for (const auto& t : r.threads)
    if (t.tid == tid && !t.stack.empty())
      return fmt::format("thread {} at {}", tid, fmt::join(cpp_frames(t, 4), " <- "));
  return "";
}

std::string seconds(double s) { return fmt::format("{:.1f} s", s); }

// Who made the call: " at train.py:42 in step <- ..." for a Python caller, else " from main +0x55
// (worker)".
std::string called_by(const RecordedCall& c) {
  if (!c.python.empty()) return " at " + c.python;
  if (!c.caller.empty()) return " from " + c.caller;
  return "";
}

std::string since_text(const RankRecord& r, const RecordedCall& c) {
  return seconds(r.time - c.started.value_or(c.enqueued));
}

// What a rank that did not come does instead: a call it waits in elsewhere, or nothing since
// its last call ended; and where its threads are.
std::string doing_instead(const RankRecord& r) {
  const RecordedCall* pending = nullptr;
  const RecordedCall* latest = nullptr;
  for (const auto& c : r.calls) {
    if (c.pending() && pending == nullptr) pending = &c;
    if (latest == nullptr || c.enqueued >= latest->enqueued) latest = &c;
  }
  auto numbered = [](const RecordedCall& c) {
    return c.kind == "collective" ? fmt::format(", collective #{} of group {}", c.seq, c.group)
                                  : std::string();
  };
  std::string doing;
  int tid = latest != nullptr ? latest->thread : 0;
  if (pending != nullptr) {
    doing = fmt::format("it waits in {}{}{} (since {})", pending->call, numbered(*pending),
                        called_by(*pending), since_text(r, *pending));
    tid = pending->thread;
  } else if (latest != nullptr && latest->ended) {
    doing = fmt::format(
        "it has made no call for {} since its last, {}{}{}, ended: it is computing, or stuck "
        "outside dtrain",
        seconds(r.time - *latest->ended), latest->call, numbered(*latest), called_by(*latest));
  } else {
    doing = "it has made no call at all";
  }
  const std::string where = whereabouts(r, tid);
  return fmt::format("rank {}: {}{}", r.rank, doing,
                     where.empty() ? "" : fmt::format("; {}", where));
}

// Named (Horovod) calls some ranks wait in and others never submitted.
std::vector<Finding> find_unsubmitted(const std::vector<RankRecord>& records) {
  std::map<std::string, std::vector<int>> waiting;  // name -> ranks with it pending
  std::map<std::string, const RecordedCall*> example;
  std::map<std::string, double> waited, since;  // the longest wait, and when it began
  for (const auto& r : records)
    for (const auto& c : r.calls)
      if (c.kind == "named" && c.pending()) {
        auto& ranks = waiting[c.name];
        if (std::find(ranks.begin(), ranks.end(), r.rank) == ranks.end()) ranks.push_back(r.rank);
        example[c.name] = &c;
        waited[c.name] = std::max(waited[c.name], r.time - c.enqueued);
        since[c.name] = since.count(c.name) ? std::min(since[c.name], c.enqueued) : c.enqueued;
      }
  // The oldest wait first: a rank that skipped a call goes on to the next one, where the
  // others then never come; the skipped call is the cause.
  std::vector<std::string> names;
  for (const auto& [name, ranks] : waiting) names.push_back(name);
  std::sort(names.begin(), names.end(),
            [&](const auto& a, const auto& b) { return since[a] < since[b]; });
  std::vector<Finding> out;
  for (const auto& name : names) {
    const auto& ranks = waiting[name];
    std::vector<int> absent;
    std::vector<std::string> absent_text;
    for (const auto& r : records)
      if (std::find(ranks.begin(), ranks.end(), r.rank) == ranks.end()) {
        absent.push_back(r.rank);
        absent_text.push_back(doing_instead(r));
      }
    if (absent.empty() || waited[name] < kNotableWait) continue;
    Finding f;
    f.kind = "never_submitted";
    f.group = example[name]->group;
    f.ranks = absent;
    const std::string by = called_by(*example[name]);
    f.text = fmt::format("{} never submitted {} ({}{}), which {} {} waited for up to {}. {}.",
                         ranks_text(absent), example[name]->call, example[name]->group,
                         by.empty() ? "" : "; submitted by the others" + by, ranks_text(ranks),
                         ranks.size() == 1 ? "has" : "have", seconds(waited[name]),
                         fmt::join(absent_text, ". "));
    out.push_back(std::move(f));
  }
  return out;
}

// The first group sequence number at which ranks called different collectives.
std::optional<Finding> find_mismatch(const std::vector<RankRecord>& records) {
  std::map<std::pair<std::string, uint32_t>, std::map<std::string, std::vector<int>>> by_seq;
  std::map<std::pair<std::string, uint32_t>, std::map<std::string, std::string>> who;  // a caller
  for (const auto& r : records)
    for (const auto& c : r.calls)
      if (c.kind == "collective") {
        by_seq[{c.group, c.seq}][c.call].push_back(r.rank);
        who[{c.group, c.seq}].try_emplace(c.call, called_by(c));
      }
  std::optional<Finding> first;
  double first_time = 0;
  for (const auto& [key, calls] : by_seq) {
    if (calls.size() < 2) continue;
    // The earliest by when it was called, across groups.
    double when = 1e300;
    for (const auto& r : records)
      for (const auto& c : r.calls)
        if (c.kind == "collective" && c.group == key.first && c.seq == key.second)
          when = std::min(when, c.enqueued);
    if (first && when >= first_time) continue;
    std::vector<std::string> parts;
    std::vector<int> all;
    size_t biggest = 0;
    for (const auto& [call, ranks] : calls) biggest = std::max(biggest, ranks.size());
    // The ranks at fault: those outside the largest camp (all of them when camps tie).
    size_t camps_of_biggest = 0;
    for (const auto& [call, ranks] : calls) camps_of_biggest += ranks.size() == biggest;
    std::vector<int> odd;
    for (const auto& [call, ranks] : calls) {
      parts.push_back(fmt::format("{} called {}{}", ranks_text(ranks), call, who[key][call]));
      if (ranks.size() < biggest || camps_of_biggest > 1)
        odd.insert(odd.end(), ranks.begin(), ranks.end());
    }
    std::sort(odd.begin(), odd.end());
    Finding f;
    f.kind = "mismatch";
    f.group = key.first;
    f.seq = key.second;
    f.ranks = odd;
    f.text = fmt::format(
        "The ranks disagree at collective #{} of group {}: {}. Every rank must call the same "
        "collectives in the same order with the same arguments; the first call that differs is "
        "where their code paths part (a condition on the rank, a skipped or extra call, another "
        "order).",
        key.second, key.first, fmt::join(parts, "; "));
    first = f;
    first_time = when;
  }
  return first;
}

// Pending point-to-point calls that wait on each other in a cycle.
std::optional<Finding> find_deadlock(const std::vector<RankRecord>& records) {
  std::map<int, const RecordedCall*> waits;  // rank -> its oldest pending p2p call
  std::map<int, const RankRecord*> by_rank;
  for (const auto& r : records) {
    by_rank[r.rank] = &r;
    for (const auto& c : r.calls)
      if (c.pending() && (c.kind == "recv" || c.kind == "send") && c.peer >= 0 &&
          !waits.count(r.rank))
        waits[r.rank] = &c;
  }
  for (const auto& [start, _] : waits) {
    std::vector<int> path{start};
    int at = start;
    while (true) {
      auto it = waits.find(at);
      if (it == waits.end()) break;
      const int next = it->second->peer;
      // A pending send to a peer that is receiving from us matches it: no wait between them.
      auto back = waits.find(next);
      if (back != waits.end() && back->second->peer == at &&
          back->second->kind != it->second->kind && back->second->tag == it->second->tag)
        break;
      auto seen = std::find(path.begin(), path.end(), next);
      if (seen != path.end()) {
        std::vector<int> cycle(seen, path.end());
        std::vector<std::string> parts;
        for (int r : cycle)
          parts.push_back(fmt::format("rank {} waits in {}{} (since {})", r, waits[r]->call,
                                      called_by(*waits[r]), since_text(*by_rank[r], *waits[r])));
        std::vector<int> sorted = cycle;
        std::sort(sorted.begin(), sorted.end());
        Finding f;
        f.kind = "deadlock";
        f.ranks = sorted;
        f.text = fmt::format(
            "Point-to-point deadlock: {}: each waits for the next, and none of them sends what "
            "another waits for. Order the calls so that one side sends first (or use isend/irecv "
            "and wait for both).",
            fmt::join(parts, "; "));
        return f;
      }
      path.push_back(next);
      at = next;
    }
  }
  return std::nullopt;
}

// Ranks that never entered the collective the others wait in.
std::vector<Finding> find_absent(const std::vector<RankRecord>& records) {
  std::vector<Finding> out;
  std::set<std::string> groups;
  for (const auto& r : records)
    for (const auto& g : r.groups) groups.insert(g);
  for (const auto& group : groups) {
    // The oldest pending collective of the group on any rank.
    const RecordedCall* stuck = nullptr;
    for (const auto& r : records)
      for (const auto& c : r.calls)
        if (c.kind == "collective" && c.group == group && c.pending() &&
            (stuck == nullptr || c.seq < stuck->seq))
          stuck = &c;
    if (stuck == nullptr) continue;
    const uint32_t k = stuck->seq;
    std::vector<int> waiting, absent;
    std::vector<std::string> absent_text;
    double waited = 0;
    for (const auto& r : records) {
      if (std::find(r.groups.begin(), r.groups.end(), group) == r.groups.end()) continue;
      const RecordedCall* last = nullptr;  // its latest call of the group
      const RecordedCall* here = nullptr;  // its call #k
      for (const auto& c : r.calls) {
        if (c.kind != "collective" || c.group != group) continue;
        if (c.seq == k) here = &c;
        if (last == nullptr || c.seq > last->seq) last = &c;
      }
      if (here != nullptr) {
        if (here->pending()) {
          waiting.push_back(r.rank);
          waited = std::max(waited, r.time - here->started.value_or(here->enqueued));
        }
        continue;
      }
      if (last != nullptr && last->seq > k) continue;  // overwritten in its ring: cannot say
      absent.push_back(r.rank);
      absent_text.push_back(doing_instead(r));
    }
    // A record taken while the job runs catches ranks a moment apart: a wait is worth naming
    // once it is longer than a step's usual skew.
    if (absent.empty() || waiting.empty() || waited < kNotableWait) continue;
    Finding f;
    f.kind = "never_entered";
    f.group = group;
    f.seq = k;
    f.ranks = absent;
    f.text = fmt::format(
        "{} never entered collective #{} of group {}, {}, in which {} {} waited up to {}. {}.",
        ranks_text(absent), k, group, stuck->call, ranks_text(waiting),
        waiting.size() == 1 ? "has" : "have", seconds(waited), fmt::join(absent_text, ". "));
    out.push_back(std::move(f));
  }
  return out;
}

// A rank that spends much longer between calls than the others: they wait for it.
std::optional<Finding> find_slow(const std::vector<RankRecord>& records) {
  if (records.size() < 2) return std::nullopt;
  // Outside time per rank over the same window: from the end of the first to the enqueue of the
  // last collective of the busiest group that every rank completed.
  std::map<std::string, size_t> count;
  for (const auto& c : records[0].calls)
    if (c.kind == "collective" && c.state == "completed") ++count[c.group];
  if (count.empty()) return std::nullopt;
  const std::string group = std::max_element(count.begin(), count.end(), [](auto& a, auto& b) {
                              return a.second < b.second;
                            })->first;
  std::set<uint32_t> common;
  bool first = true;
  for (const auto& r : records) {
    std::set<uint32_t> mine;
    for (const auto& c : r.calls)
      if (c.kind == "collective" && c.group == group && c.state == "completed") mine.insert(c.seq);
    if (first) {
      common = mine;
      first = false;
    } else {
      std::set<uint32_t> both;
      std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(),
                            std::inserter(both, both.begin()));
      common = both;
    }
  }
  if (common.size() < 4) return std::nullopt;
  const uint32_t lo = *common.begin(), hi = *common.rbegin();
  std::vector<std::pair<double, int>> outside;  // (seconds between calls, rank)
  for (const auto& r : records) {
    double start = 0, end = 0;
    std::vector<std::pair<double, double>> spans;  // every call inside the window
    for (const auto& c : r.calls) {
      if (c.kind == "collective" && c.group == group && c.seq == lo) start = c.ended.value_or(0);
      if (c.kind == "collective" && c.group == group && c.seq == hi) end = c.enqueued;
    }
    if (start == 0 || end <= start) return std::nullopt;
    for (const auto& c : r.calls)
      if (c.ended && *c.ended > start && c.enqueued < end)
        spans.emplace_back(std::max(c.started.value_or(c.enqueued), start),
                           std::min(*c.ended, end));
    std::sort(spans.begin(), spans.end());
    double inside = 0, reach = start;
    for (auto [a, b] : spans) {
      a = std::max(a, reach);
      if (b > a) {
        inside += b - a;
        reach = b;
      }
    }
    outside.emplace_back(std::max(0.0, (end - start) - inside), r.rank);
  }
  std::sort(outside.begin(), outside.end());
  const auto [slowest, rank] = outside.back();
  std::vector<double> others;
  for (size_t i = 0; i + 1 < outside.size(); ++i) others.push_back(outside[i].first);
  const double median = others[others.size() / 2];
  const double window = slowest;  // at least as long as anyone's outside time
  if (slowest < 1.5 * median || slowest - median < 0.05 || window <= 0) return std::nullopt;
  Finding f;
  f.kind = "slow";
  f.group = group;
  f.ranks = {rank};
  f.text = fmt::format(
      "Rank {} is slow: {:.1f}x the other ranks' time outside collectives ({} against a median "
      "of {} over collectives #{}-#{} of group {}); the others wait for it in every collective. "
      "Look at what it does between calls (its data loading, its device, its CPU binding, other "
      "work on its host).",
      rank, median > 0 ? slowest / median : INFINITY, seconds(slowest), seconds(median), lo, hi,
      group);
  return f;
}

}  // namespace

std::vector<RankRecord> read_flight_records(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw InvalidArgumentError(fmt::format("dtrain doctor: {} is not a directory", dir));
  std::vector<RankRecord> records;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".json" || name[0] == '.') continue;
    if (name.rfind("rank", 0) != 0 && name.rfind("pid", 0) != 0) continue;
    records.push_back(parse(e.path().string()));
  }
  if (records.empty())
    throw InvalidArgumentError(fmt::format(
        "dtrain doctor: no flight records (rank<R>.json) in {}: a rank writes its record on a "
        "failure, a timeout or SIGUSR2 (`kill -USR2 <pid>`), into DTRAIN_FLIGHT_DIR",
        dir));
  std::sort(records.begin(), records.end(),
            [](const auto& a, const auto& b) { return a.rank < b.rank; });
  return records;
}

Diagnosis diagnose(const std::vector<RankRecord>& records) {
  Diagnosis d;
  if (auto f = find_mismatch(records)) d.findings.push_back(*f);
  if (auto f = find_deadlock(records)) d.findings.push_back(*f);
  for (auto& f : find_absent(records)) d.findings.push_back(std::move(f));
  for (auto& f : find_unsubmitted(records)) d.findings.push_back(std::move(f));
  if (auto f = find_slow(records)) d.findings.push_back(*f);
  int world = 0;
  std::set<int> present;
  for (const auto& r : records) {
    world = std::max(world, r.world_size);
    present.insert(r.rank);
  }
  std::vector<int> missing;
  for (int r = 0; r < world; ++r)
    if (!present.count(r)) missing.push_back(r);
  if (!missing.empty()) {
    // The launcher's word on how they ended, where it left one beside the records.
    std::vector<std::string> words;
    const std::string dir = std::filesystem::path(records[0].path).parent_path().string();
    for (int r : missing) {
      std::ifstream in(comm::exit_word_path(dir, r));
      std::string word;
      if (in && std::getline(in, word) && !word.empty())
        words.push_back(fmt::format("rank {}'s process {} (dtrain run)", r, word));
    }
    Finding f;
    f.kind = "missing";
    f.ranks = missing;
    f.text = fmt::format(
        "No record from {} of {}: {}.", ranks_text(missing), world,
        words.empty() ? fmt::format("{} died, or could not write its record (a process stopped "
                                    "by SIGSTOP or stuck in the kernel does not answer SIGUSR2)",
                                    missing.size() == 1 ? "it" : "they")
                      : fmt::format("{}", fmt::join(words, "; ")));
    d.findings.push_back(std::move(f));
  }
  return d;
}

std::string describe(const Diagnosis& d, const std::vector<RankRecord>& records,
                     const std::string& dir) {
  std::vector<int> ranks;
  std::set<std::string> reasons;
  for (const auto& r : records) {
    ranks.push_back(r.rank);
    reasons.insert(r.reason);
  }
  std::string out =
      fmt::format("dtrain doctor: {} record{} ({}) in {}, dumped for: {}\n", records.size(),
                  records.size() == 1 ? "" : "s", ranks_text(ranks), dir, fmt::join(reasons, "; "));
  if (d.healthy()) {
    out +=
        "Nothing wrong found: the ranks agree on every recorded call, none waits for another, "
        "and none is much slower than the rest.\n";
    return out;
  }
  for (const auto& f : d.findings) out += fmt::format("- {}\n", f.text);
  return out;
}

json to_json(const Diagnosis& d, const std::vector<RankRecord>& records) {
  json findings = json::array();
  for (const auto& f : d.findings)
    findings.push_back({{"kind", f.kind},
                        {"group", f.group},
                        {"seq", f.seq},
                        {"ranks", f.ranks},
                        {"text", f.text}});
  json ranks = json::array();
  for (const auto& r : records)
    ranks.push_back({{"rank", r.rank}, {"path", r.path}, {"reason", r.reason}, {"pid", r.pid}});
  return {{"healthy", d.healthy()}, {"findings", findings}, {"records", ranks}};
}

}  // namespace dtrain::launch
