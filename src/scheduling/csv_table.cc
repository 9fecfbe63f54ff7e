#include "scheduling/csv_table.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::scheduling {
namespace {

std::vector<std::string> split(std::string_view line) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = line.find(',', start);
    std::string_view field =
        line.substr(start, comma == std::string_view::npos ? comma : comma - start);
    while (!field.empty() && (field.front() == ' ' || field.front() == '\t'))
      field.remove_prefix(1);
    while (!field.empty() && (field.back() == ' ' || field.back() == '\t')) field.remove_suffix(1);
    out.emplace_back(field);
    if (comma == std::string_view::npos) return out;
    start = comma + 1;
  }
}

}  // namespace

CsvTable CsvTable::read(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw InvalidArgumentError(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  CsvTable t;
  t.path_ = path;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find('"') != std::string::npos)
      throw InvalidArgumentError(
          fmt::format("{}:{}: quoted fields are not supported: {}", path, number, line));
    if (t.header_.empty()) {
      if (line.empty()) throw InvalidArgumentError(fmt::format("{}:1: no header line", path));
      t.header_ = split(line);
      continue;
    }
    if (line.empty()) continue;
    auto fields = split(line);
    if (fields.size() != t.header_.size())
      throw InvalidArgumentError(fmt::format("{}:{}: {} field(s) where the header has {} ({}): {}",
                                             path, number, fields.size(), t.header_.size(),
                                             fmt::join(t.header_, ","), line));
    t.rows_.push_back(std::move(fields));
    t.lines_.push_back(number);
  }
  if (in.bad())
    throw InvalidArgumentError(fmt::format("reading {} failed: {}", path, std::strerror(errno)));
  if (t.header_.empty()) throw InvalidArgumentError(fmt::format("{} is empty", path));
  return t;
}

bool CsvTable::has_column(std::string_view name) const {
  for (const auto& h : header_)
    if (h == name) return true;
  return false;
}

size_t CsvTable::column(std::string_view name) const {
  for (size_t i = 0; i < header_.size(); ++i)
    if (header_[i] == name) return i;
  throw InvalidArgumentError(
      fmt::format("{}: no column '{}' (it has {})", path_, name, fmt::join(header_, ", ")));
}

std::string CsvTable::where(size_t row) const { return fmt::format("{}:{}", path_, lines_[row]); }

double CsvTable::number(size_t row, size_t col) const {
  const std::string& s = rows_[row][col];
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v))
    throw InvalidArgumentError(
        fmt::format("{}: column '{}': '{}' is not a finite number", where(row), header_[col], s));
  return v;
}

int64_t CsvTable::integer(size_t row, size_t col) const {
  const std::string& s = rows_[row][col];
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (!s.empty() && ec == std::errc() && end == s.data() + s.size()) return v;
  // Pandas writes whole numbers of float columns as "6.0": a zero fraction is accepted.
  double d = 0;
  auto [dend, dec] = std::from_chars(s.data(), s.data() + s.size(), d);
  if (!s.empty() && dec == std::errc() && dend == s.data() + s.size() && d == std::floor(d) &&
      std::fabs(d) < 9e15)
    return static_cast<int64_t>(d);
  throw InvalidArgumentError(
      fmt::format("{}: column '{}': '{}' is not a whole number", where(row), header_[col], s));
}

}  // namespace dtrain::scheduling
