#include "launch/sample_ledger.h"

#include <fstream>
#include <set>
#include <sstream>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::launch {

SampleLedger SampleLedger::read(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgumentError(fmt::format("sample log {} cannot be read", path));
  struct Line {
    int64_t epoch, index, step, restart;
  };
  std::vector<Line> lines;
  std::string text;
  int64_t number = 0;
  while (std::getline(in, text)) {
    ++number;
    std::istringstream fields(text);
    Line l{};
    std::string extra;
    if (!(fields >> l.epoch >> l.index >> l.step >> l.restart) || (fields >> extra)) {
      if (in.peek() == std::char_traits<char>::eof() && !in.bad()) break;  // a cut last write
      throw InvalidArgumentError(fmt::format(
          "sample log {}: line {} is '{}', not 'epoch index step restart'", path, number, text));
    }
    lines.push_back(l);
  }
  std::map<int64_t, int64_t> latest;           // step -> the latest restart that trained it
  std::set<std::pair<int64_t, int64_t>> runs;  // (step, restart)
  for (const Line& l : lines) {
    latest[l.step] = std::max(latest[l.step], l.restart);
    runs.emplace(l.step, l.restart);
  }
  SampleLedger ledger;
  ledger.lines = static_cast<int64_t>(lines.size());
  ledger.steps = static_cast<int64_t>(latest.size());
  ledger.steps_redone = static_cast<int64_t>(runs.size()) - ledger.steps;
  for (const Line& l : lines)
    if (l.restart == latest[l.step]) ++ledger.trained[{l.epoch, l.index}];
  return ledger;
}

LedgerComparison compare_ledgers(const SampleLedger& run, const SampleLedger& reference) {
  LedgerComparison c;
  for (const auto& [sample, times] : reference.trained) {
    auto it = run.trained.find(sample);
    const int64_t got = it == run.trained.end() ? 0 : it->second;
    if (got < times) c.lost += times - got;
  }
  for (const auto& [sample, times] : run.trained) {
    auto it = reference.trained.find(sample);
    const int64_t want = it == reference.trained.end() ? 0 : it->second;
    if (times > want) c.repeated += times - want;
  }
  return c;
}

}  // namespace dtrain::launch
