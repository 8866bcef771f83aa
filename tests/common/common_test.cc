#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "common/printable.h"
#include "common/trace.h"
#include "common/units.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(UnitsTest, ParsesSizesWithSuffixes) {
  EXPECT_DOUBLE_EQ(*ParseBytes("8GiB"), 8.0 * kGiB);
  EXPECT_DOUBLE_EQ(*ParseBytes("25GB"), 25e9);
  EXPECT_DOUBLE_EQ(*ParseBytes("1e9"), 1e9);
  EXPECT_DOUBLE_EQ(*ParseBytes(" 512 "), 512);
  EXPECT_DOUBLE_EQ(*ParseBytesPerSecond("25GiB/s"), 25.0 * kGiB);
  EXPECT_FALSE(ParseBytes("-1").ok());
  EXPECT_FALSE(ParseBytes("8 parsecs").ok());
  EXPECT_FALSE(ParseBytes("").ok());
}

TEST(JsonTest, NamesMissingAndMistypedFields) {
  auto j = ParseJson(R"({"a": 1, "b": "x", "c": -2})", "f.json");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(*GetInt(*j, "a", "f.json"), 1);
  auto missing = GetNumber(*j, "z", "f.json");
  EXPECT_EQ(missing.status().message(), "f.json.z: missing field");
  auto mistyped = GetNumber(*j, "b", "f.json");
  EXPECT_EQ(mistyped.status().message(), "f.json.b: expected a number");
  EXPECT_FALSE(GetNonNegativeNumber(*j, "c", "f.json").ok());
  EXPECT_EQ(*GetNumberOr(*j, "z", 7.5, "f.json"), 7.5);
  auto bad = ParseJson("{\"a\": [1, 2", "bad.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad.json: malformed JSON"), std::string::npos);
}

// Files written by Python tools spell "unset" as null as often as by leaving the field out:
// both take the default; a value of another type is still an error naming the field.
TEST(JsonTest, NullIsUnsetForFilesWrittenByPythonTools) {
  auto j = ParseJson(R"({"on": true, "off": false, "none": null, "text": "yes"})", "c.json");
  ASSERT_TRUE(j.ok());
  EXPECT_TRUE(IsSet(*j, "on"));
  EXPECT_TRUE(IsSet(*j, "off"));
  EXPECT_FALSE(IsSet(*j, "none"));
  EXPECT_FALSE(IsSet(*j, "absent"));
  EXPECT_FALSE(IsSet(Json::array({1, 2}), "on"));
  EXPECT_EQ(*GetBoolOrUnset(*j, "on", false, "c.json"), true);
  EXPECT_EQ(*GetBoolOrUnset(*j, "off", true, "c.json"), false);
  EXPECT_EQ(*GetBoolOrUnset(*j, "none", true, "c.json"), true);
  EXPECT_EQ(*GetBoolOrUnset(*j, "absent", false, "c.json"), false);
  auto mistyped = GetBoolOrUnset(*j, "text", false, "c.json");
  ASSERT_FALSE(mistyped.ok());
  EXPECT_EQ(mistyped.status().message(), "c.json.text: expected true or false");
}

// Integers beyond int64 are refused, not wrapped to negative numbers (a plan's num_layers of
// 2^63 was reported as -9223372036854775808).
TEST(JsonTest, IntegersBeyondInt64AreRefused) {
  auto j = ParseJson(R"({"n": 9223372036854775808, "m": 9223372036854775807,
                         "a": [1, 18446744073709551615]})", "f.json");
  ASSERT_TRUE(j.ok());
  auto n = GetInt(*j, "n", "f.json");
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().message(),
            "f.json.n: is too large (9223372036854775808 > 9223372036854775807)");
  EXPECT_EQ(*GetInt(*j, "m", "f.json"), INT64_MAX);
  EXPECT_FALSE(GetIntArray(*j, "a", "f.json").ok());
}

// Text from a file is shown with every byte that is not printable UTF-8 escaped, and cut.
TEST(PrintableTest, EscapesWhatATerminalWouldInterpret) {
  EXPECT_EQ(Printable("plain text\twith a tab\n"), "plain text\twith a tab\n");
  EXPECT_EQ(Printable("caf\xc3\xa9 \xe2\x9c\x93"), "caf\xc3\xa9 \xe2\x9c\x93");  // UTF-8 kept
  EXPECT_EQ(Printable(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(Printable("\x1b[31mred"), "\\x1b[31mred");  // an escape sequence
  EXPECT_EQ(Printable("\xff\xfe"), "\\xff\\xfe");       // not UTF-8
  EXPECT_EQ(Printable("\xc3"), "\\xc3");                 // a sequence cut short
  EXPECT_EQ(Printable("\xc2\x85"), "\\xc2\\x85");         // a C1 control character
  EXPECT_EQ(Printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(Printable("abcdef", 3), "abc...");
  EXPECT_EQ(Printable("abc", 3), "abc");
}

// The one JSON reader refuses nesting deeper than kMaxJsonDepth before parsing it: 50,000
// nested objects (a Piper file that crashed `tandem plan` through the parser's recursion) are
// one InvalidArgument naming the file and the depth; kMaxJsonDepth levels still parse, and
// brackets inside strings do not count.
TEST(JsonTest, NestingBeyondTheLimitIsRefusedBeforeParsing) {
  auto nested = [](int depth) {
    std::string text;
    for (int i = 0; i < depth; ++i) text += "{\"a\":";
    text += "1";
    text += std::string(depth, '}');
    return text;
  };
  auto deep = tandem::ParseJson(nested(50000), "deep.json");
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(deep.status().message(),
            "deep.json: JSON nested 50000 levels deep; at most 256 are read");
  EXPECT_TRUE(tandem::ParseJson(nested(tandem::kMaxJsonDepth), "ok.json").ok());
  EXPECT_FALSE(tandem::ParseJson(nested(tandem::kMaxJsonDepth + 1), "over.json").ok());
  const std::string quoted = "{\"a\": \"" + std::string(1000, '[') + "\"}";
  EXPECT_EQ(tandem::JsonNestingDepth(quoted), 1);
  EXPECT_TRUE(tandem::ParseJson(quoted, "quoted.json").ok());
}

TEST(FileTest, AtomicWriteRoundTripsAndLeavesNoTemporary) {
  std::string path = ::testing::TempDir() + "/tandem_atomic.txt";
  ASSERT_TRUE(WriteFileAtomically(path, "hello").ok());
  EXPECT_EQ(*ReadFile(path), "hello");
  ASSERT_TRUE(WriteFileAtomically(path, "second").ok());
  EXPECT_EQ(*ReadFile(path), "second");
  EXPECT_FALSE(WriteFileAtomically("/nonexistent-dir/x.txt", "x").ok());
  EXPECT_EQ(ReadFile("/nonexistent-dir/x.txt").status().code(), absl::StatusCode::kNotFound);
  std::remove(path.c_str());
}

TEST(FileTest, StreamedWriterAppearsOnlyOnCommit) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "tandem_streamed";
  ASSERT_TRUE(RemoveAll(dir.string()).ok());
  fs::create_directories(dir);
  const std::string path = (dir / "out.txt").string();
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  // Pieces smaller and larger than the buffer, through Append and the buffer itself.
  std::string expected;
  {
    auto writer = AtomicFileWriter::Open(path);
    ASSERT_TRUE(writer.ok()) << writer.status();
    for (int k = 0; k < 3000; ++k) {
      const std::string piece = absl::StrCat("line ", k, "\n");
      writer->Append(piece);
      expected += piece;
    }
    const std::string big(3 << 20, 'x');
    writer->Append(big);
    expected += big;
    writer->buffer() += "tail";
    writer->Flush();
    expected += "tail";
    EXPECT_EQ(writer->bytes(), static_cast<int64_t>(expected.size()));
    EXPECT_EQ(*ReadFile(path), "old");  // nothing replaced before the commit
    ASSERT_TRUE(writer->Commit().ok());
  }
  EXPECT_EQ(*ReadFile(path), expected);
  // Dropped without a commit (an error on the way): the old file stays, no temporary is left.
  {
    auto writer = AtomicFileWriter::Open(path);
    ASSERT_TRUE(writer.ok());
    writer->Append(std::string(5 << 20, 'y'));
  }
  EXPECT_EQ(*ReadFile(path), expected);
  {
    auto writer = AtomicFileWriter::Open((dir / "never.txt").string());
    ASSERT_TRUE(writer.ok());
    writer->Append("half");
  }
  EXPECT_FALSE(fs::exists(dir / "never.txt"));
  int entries = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1);  // out.txt alone
  // Two writers on one path at once: each writes its own temporary, the last commit wins.
  {
    auto first = AtomicFileWriter::Open(path);
    auto second = AtomicFileWriter::Open(path);
    ASSERT_TRUE(first.ok() && second.ok());
    first->Append(std::string(2 << 20, 'a'));
    second->Append("second");
    ASSERT_TRUE(first->Commit().ok());
    EXPECT_EQ(ReadFile(path)->size(), size_t{2} << 20);
    ASSERT_TRUE(second->Commit().ok());
    EXPECT_EQ(*ReadFile(path), "second");
  }
  // A write that fails (a full disk) is reported by Commit, naming the path.
  if (fs::exists("/dev/full")) {
    auto full = AtomicFileWriter::Open("/dev/full");
    ASSERT_TRUE(full.ok());
    full->Append(std::string(3 << 20, 'z'));
    const absl::Status status = full->Commit();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(status.message(), "/dev/full: write failed: No space left on device");
  }
  const auto folder = AtomicFileWriter::Open(dir.string());
  EXPECT_EQ(folder.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(AtomicFileWriter::Open((dir / "missing" / "x").string()).ok());
  ASSERT_TRUE(RemoveAll(dir.string()).ok());
}

TEST(FileTest, RemoveAllRemovesATreeButNotWhatItsLinksPointTo) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(::testing::TempDir()) / "tandem_remove_all";
  const fs::path outside = fs::path(::testing::TempDir()) / "tandem_remove_all_kept.txt";
  ASSERT_TRUE(RemoveAll(root.string()).ok());
  fs::create_directories(root / "a" / "b");
  ASSERT_TRUE(WriteFileAtomically((root / "a" / "b" / "f.txt").string(), "x").ok());
  ASSERT_TRUE(WriteFileAtomically((root / "g.txt").string(), "y").ok());
  ASSERT_TRUE(WriteFileAtomically(outside.string(), "kept").ok());
  fs::create_symlink(outside, root / "a" / "link");
  fs::create_directory_symlink(fs::path(::testing::TempDir()), root / "dir_link");

  EXPECT_TRUE(RemoveAll(root.string()).ok());
  EXPECT_FALSE(fs::exists(fs::symlink_status(root)));
  EXPECT_EQ(ReadFile(outside.string()).value_or(""), "kept");  // the link's target stays
  EXPECT_TRUE(fs::exists(::testing::TempDir()));
  EXPECT_TRUE(RemoveAll(root.string()).ok());  // nothing there: fine
  EXPECT_TRUE(RemoveAll(outside.string()).ok());  // a plain file
  EXPECT_FALSE(fs::exists(outside));
}

TEST(FileTest, AppendGrowsAFileLineByLine) {
  const std::string path = ::testing::TempDir() + "/tandem_append.jsonl";
  std::remove(path.c_str());
  ASSERT_TRUE(AppendToFile(path, "{\"a\": 1}\n").ok());
  ASSERT_TRUE(AppendToFile(path, "{\"a\": 2}\n").ok());
  EXPECT_EQ(*ReadFile(path), "{\"a\": 1}\n{\"a\": 2}\n");
  EXPECT_FALSE(AppendToFile("/nonexistent-dir/x.jsonl", "x").ok());
  std::remove(path.c_str());
}

// Ranks of one job check the same missing folder at once, each making and removing it: a rank
// that found another's folder gone before it checked it said "cannot be written: No such file
// or directory" (seen once in a full test run).
TEST(FileTest, ConcurrentChecksOfOneMissingFolderAllPass) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(::testing::TempDir()) / "tandem_output_race";
  ASSERT_TRUE(RemoveAll(root.string()).ok());
  fs::create_directories(root);
  const std::string wanted = (root / "checkpoints").string();
  for (int round = 0; round < 300; ++round) {
    std::vector<absl::Status> results(4);
    std::vector<std::thread> checkers;
    for (absl::Status& result : results) {
      checkers.emplace_back([&result, &wanted] {
        result = CheckOutputFolder(wanted, "--checkpoint-dir");
      });
    }
    for (std::thread& t : checkers) t.join();
    for (const absl::Status& result : results) ASSERT_TRUE(result.ok()) << round << ": " << result;
    ASSERT_FALSE(fs::exists(wanted)) << "a check leaves nothing behind";
  }
  ASSERT_TRUE(RemoveAll(root.string()).ok());
}

TEST(FileTest, OutputPathsAreCheckedBeforeAnythingIsWritten) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(::testing::TempDir()) / "tandem_output_paths";
  ASSERT_TRUE(RemoveAll(root.string()).ok());
  fs::create_directories(root / "there");
  ASSERT_TRUE(WriteFileAtomically((root / "file.txt").string(), "x").ok());
  // Files: the folder must exist; a folder is no file; standard output is fine.
  EXPECT_TRUE(CheckOutputFile((root / "there" / "log.jsonl").string(), "--log-json").ok());
  EXPECT_TRUE(CheckOutputFile((root / "file.txt").string(), "--log-json").ok());
  EXPECT_TRUE(CheckOutputFile("-", "--log-json").ok());
  EXPECT_TRUE(CheckOutputFile("relative_name.json", "--timeline").ok());
  const absl::Status missing =
      CheckOutputFile((root / "missing" / "log.jsonl").string(), "--log-json");
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("--log-json"), std::string::npos) << missing;
  EXPECT_NE(missing.message().find("does not exist"), std::string::npos) << missing;
  EXPECT_EQ(CheckOutputFile((root / "there").string(), "--timeline").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckOutputFile((root / "file.txt" / "x.json").string(), "--timeline").code(),
            absl::StatusCode::kInvalidArgument);
  // Folders: created with their parents, so the nearest existing one must be a folder.
  EXPECT_TRUE(CheckOutputFolder((root / "there").string(), "--checkpoint-dir").ok());
  EXPECT_TRUE(CheckOutputFolder((root / "new" / "deeper").string(), "--checkpoint-dir").ok());
  const absl::Status blocked =
      CheckOutputFolder((root / "file.txt" / "ckpt").string(), "--checkpoint-dir");
  EXPECT_EQ(blocked.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(blocked.message().find("is a file"), std::string::npos) << blocked;
  EXPECT_FALSE(fs::exists(root / "new"));  // checking writes nothing
  // A file system that takes no folder whatever the permissions say (sysfs, also for root).
  if (fs::is_directory("/sys/kernel")) {
    const absl::Status sysfs = CheckOutputFolder("/sys/kernel/tandem_checkpoints", "--checkpoint-dir");
    EXPECT_EQ(sysfs.code(), absl::StatusCode::kInvalidArgument) << sysfs;
    EXPECT_NE(sysfs.message().find("cannot be made"), std::string::npos) << sysfs;
  }
  ASSERT_TRUE(RemoveAll(root.string()).ok());
}

TEST(TraceTest, RoundTripsThroughJson) {
  ChromeTrace trace;
  trace.NameProcess(1, "rank 1");
  trace.Add({"F0.1", "forward", 1, 0, 0.5, 0.25, {{"stage", 0}}});
  auto back = ChromeTrace::FromJson(trace.ToJson());
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->events().size(), 1u);
  EXPECT_EQ(back->events()[0].name, "F0.1");
  EXPECT_DOUBLE_EQ(back->events()[0].start_seconds, 0.5);
  EXPECT_DOUBLE_EQ(back->events()[0].duration_seconds, 0.25);
  ChromeTrace merged;
  merged.Merge(*back, 4);
  EXPECT_EQ(merged.events()[0].pid, 5);
}

// WriteFile streams the events (TraceFileWriter) instead of building the JSON: what it writes
// reads back as ToJson's document, names that need escaping included.
TEST(TraceTest, StreamedFileEqualsTheDocument) {
  ChromeTrace trace;
  trace.NameProcess(0, "rank \"0\"");
  trace.NameThread(0, 2, "tab\there\\back\x01");
  trace.Add({"F0.1", "forward", 0, 0, 0.5, 0.25, {{"stage", 0}, {"microbatch", 1}}});
  trace.Add({"wait <R1.2", "receive", 0, 1, 1e-7, 12345.678901234, {{"note", "x"}}});
  trace.Add({"step", "optimizer", 3, 0, 1.0 / 3.0, 0, nlohmann::json::object()});
  const std::string path = ::testing::TempDir() + "/tandem_trace_stream.json";
  ASSERT_TRUE(trace.WriteFile(path).ok());
  auto text = ReadFile(path);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(nlohmann::json::parse(*text), trace.ToJson());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tandem
