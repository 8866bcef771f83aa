// The JSON log of a training run as several reporters write it in turn (an elastic job's
// reporter changes when ranks die or join): every iteration logged once, and a line a dead
// reporter left half-written removed before the next one.
#include "cli/torch/train_reporter.h"

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::cli {
namespace {

std::string TempLog(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("tandem_train_reporter_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

ProgressLine Line(int iteration) {
  ProgressLine l;
  l.iteration = iteration;
  l.end = 10;
  l.loss = 1.0 / iteration;
  l.seconds = 0.01;
  return l;
}

// The iterations of the log's lines, in order; every line must be JSON.
std::vector<int> LoggedIterations(const std::string& path) {
  std::vector<int> out;
  std::istringstream in(*ReadFile(path));
  std::string row;
  while (std::getline(in, row)) {
    const nlohmann::json line = nlohmann::json::parse(row, nullptr, false);
    EXPECT_FALSE(line.is_discarded()) << "not JSON: " << row;
    if (line.is_object() && line.contains("iteration")) out.push_back(line["iteration"]);
  }
  return out;
}

TEST(TrainReporterTest, ARankThatReportsAgainReadsTheLogFirst) {
  const std::string log = TempLog("again.jsonl");
  TrainReporter old_rank(log), started_rank(log);
  ASSERT_TRUE(old_rank.StartLog().ok());
  ASSERT_TRUE(old_rank.Iteration(Line(1)).ok());
  ASSERT_TRUE(old_rank.Iteration(Line(2)).ok());
  // A growth: the started rank reports iterations 3 and 4, then dies; the old rank reports
  // again and, as every new reporter does, reports the committed iteration (4) once more.
  old_rank.StopReporting();
  ASSERT_TRUE(started_rank.Iteration(Line(3)).ok());
  ASSERT_TRUE(started_rank.Iteration(Line(4)).ok());
  ASSERT_TRUE(old_rank.Iteration(Line(4)).ok());
  ASSERT_TRUE(old_rank.Iteration(Line(5)).ok());
  EXPECT_EQ(LoggedIterations(log), (std::vector<int>{1, 2, 3, 4, 5}));
  std::filesystem::remove(log);
}

TEST(TrainReporterTest, AHalfWrittenLineOfADeadReporterIsRemoved) {
  const std::string log = TempLog("half.jsonl");
  TrainReporter first(log), next(log);
  ASSERT_TRUE(first.StartLog().ok());
  ASSERT_TRUE(first.Iteration(Line(1)).ok());
  ASSERT_TRUE(AppendToFile(log, R"({"iteration":2,"lo)").ok());  // died writing it
  ASSERT_TRUE(next.Iteration(Line(2)).ok());
  EXPECT_EQ(LoggedIterations(log), (std::vector<int>{1, 2}));
  std::filesystem::remove(log);
}

}  // namespace
}  // namespace tandem::cli
