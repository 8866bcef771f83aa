// A small reader for the comma-separated tables the cluster module loads (application traces,
// workloads, cluster specs). No quoting: none of those files quote fields. Errors name the file
// and line.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::cluster::internal {

class CsvTable {
 public:
  // Parses `text`; `path` only names the source in messages. Blank lines are skipped; every
  // other line must have as many fields as the header.
  static absl::StatusOr<CsvTable> Parse(const std::string& text, const std::string& path);
  static absl::StatusOr<CsvTable> Read(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<std::string>& header() const { return header_; }
  int rows() const { return static_cast<int>(rows_.size()); }
  // Index of a column, or InvalidArgument naming the file and the columns it has.
  absl::StatusOr<int> Column(const std::string& name) const;
  // Indices of several columns, in the order named.
  absl::StatusOr<std::vector<int>> Columns(const std::vector<std::string>& names) const;
  const std::string& Field(int row, int column) const { return rows_[row][column]; }
  int Line(int row) const { return lines_[row]; }
  // "path:line: " for messages about a row.
  std::string Where(int row) const;
  // A field as a number; InvalidArgument with file, line and column otherwise.
  absl::StatusOr<double> Number(int row, int column) const;
  absl::StatusOr<long long> Integer(int row, int column) const;

 private:
  std::string path_;
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
  std::vector<int> lines_;
};

}  // namespace tandem::cluster::internal
