#include "cluster/internal/csv.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "common/file_util.h"
#include "common/printable.h"
#include "common/status.h"

namespace tandem::cluster::internal {

absl::StatusOr<CsvTable> CsvTable::Parse(const std::string& text, const std::string& path) {
  CsvTable table;
  table.path_ = path;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripTrailingAsciiWhitespace(line);
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    std::vector<std::string> fields;
    for (absl::string_view field : absl::StrSplit(line, ',')) {
      fields.emplace_back(absl::StripAsciiWhitespace(field));
    }
    if (table.header_.empty()) {
      table.header_ = std::move(fields);
      continue;
    }
    if (fields.size() != table.header_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", line_number, ": expected ", table.header_.size(), " fields (",
          absl::StrJoin(table.header_, ","), "), got ", fields.size()));
    }
    table.rows_.push_back(std::move(fields));
    table.lines_.push_back(line_number);
  }
  if (table.header_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": empty file, expected a CSV header"));
  }
  return table;
}

absl::StatusOr<CsvTable> CsvTable::Read(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return Parse(text, path);
}

absl::StatusOr<int> CsvTable::Column(const std::string& name) const {
  for (size_t i = 0; i < header_.size(); ++i) {
    if (header_[i] == name) return static_cast<int>(i);
  }
  return absl::InvalidArgumentError(absl::StrCat(path_, ": no column '", name,
                                                 "' (columns: ", Printable(absl::StrJoin(header_, ","), 200),
                                                 ")"));
}

absl::StatusOr<std::vector<int>> CsvTable::Columns(const std::vector<std::string>& names) const {
  std::vector<int> index;
  index.reserve(names.size());
  for (const std::string& name : names) {
    TANDEM_ASSIGN_OR_RETURN(int column, Column(name));
    index.push_back(column);
  }
  return index;
}

std::string CsvTable::Where(int row) const { return absl::StrCat(path_, ":", lines_[row], ": "); }

absl::StatusOr<double> CsvTable::Number(int row, int column) const {
  double value = 0;
  if (!absl::SimpleAtod(rows_[row][column], &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat(Where(row), "column '", header_[column],
                                                   "': not a number: '", rows_[row][column],
                                                   "'"));
  }
  return value;
}

absl::StatusOr<long long> CsvTable::Integer(int row, int column) const {
  TANDEM_ASSIGN_OR_RETURN(double value, Number(row, column));
  if (value != std::floor(value) || std::fabs(value) > 9e15) {
    return absl::InvalidArgumentError(absl::StrCat(Where(row), "column '", header_[column],
                                                   "': not an integer: '", rows_[row][column],
                                                   "'"));
  }
  return static_cast<long long>(value);
}

}  // namespace tandem::cluster::internal
