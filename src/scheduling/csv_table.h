// A CSV file read whole, for the scheduling simulator's traces and workloads: every cell is
// found by column name, and every bad cell is reported as FILE:LINE, the column and the text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::scheduling {

class CsvTable {
 public:
  // Reads `path`: a header line, then rows with as many comma-separated fields. Quotes are not
  // supported (none of the traces need them) and are refused. Throws InvalidArgumentError naming
  // the file and line of a row with the wrong number of fields, or an unreadable file.
  static CsvTable read(const std::string& path);

  const std::string& path() const { return path_; }
  size_t rows() const { return rows_.size(); }
  bool has_column(std::string_view name) const;
  // The index of a column; throws naming the file and the columns it does have.
  size_t column(std::string_view name) const;

  const std::string& text(size_t row, size_t col) const { return rows_[row][col]; }
  double number(size_t row, size_t col) const;    // finite, or an error naming FILE:LINE
  int64_t integer(size_t row, size_t col) const;  // a whole number that fits, or an error
  // "FILE:LINE" of a row, for the caller's own errors about it, and the line alone.
  std::string where(size_t row) const;
  int line(size_t row) const { return lines_[row]; }

 private:
  std::string path_;
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
  std::vector<int> lines_;  // the file line of each row (1-based; the header is line 1)
};

}  // namespace dtrain::scheduling
