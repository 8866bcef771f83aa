// Every input format, mutated: truncations, wrong types, non-finite and out-of-range numbers,
// missing and duplicated fields, garbage bytes. Two levels:
//   * in process, several hundred mutations of each format through its parser: no exception
//     escapes, and a rejection is a bad-input status (InvalidArgument, NotFound, OutOfRange,
//     DataLoss, ResourceExhausted) with a one-line message;
//   * through the `tandem` program (its path is the first argument): a rejected file exits 2
//     with one line on stderr and writes nothing; outputs given as a directory, a symbolic
//     link or a FIFO are handled (exit 2, the link kept, the FIFO written).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "common/status.h"
#include "data/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "pipeline/generators.h"
#include "pipeline/plan.h"
#include "pipeline/profile.h"
#include "pipeline/simulator.h"
#include "pipeline/torch_csv.h"
#include "planner/cluster.h"
#include "planner/importers.h"
#include "runtime/checkpoint.h"

namespace tandem {
namespace {

std::string g_tandem;  // path of the tandem program

constexpr int kCasesPerFormat = 120;

// ---- Mutations ---------------------------------------------------------------------------

// Values that break a field: wrong types, non-finite and out-of-range numbers.
const std::vector<std::string>& HostileValues() {
  static const std::vector<std::string> values = {
      "1e400",  "-1e400", "-1",      "0",    "1e18", "9223372036854775807", "18446744073709551615",
      "-9223372036854775808", "2.5", "\"x\"", "null", "[]",  "{}",   "true", "1e-400",
      "4611686018427387904"};
  return values;
}

// Positions of the numbers in `text` (start, length).
std::vector<std::pair<size_t, size_t>> NumberSpans(const std::string& text) {
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t i = 0; i < text.size();) {
    const bool start = (text[i] >= '0' && text[i] <= '9') ||
                       (text[i] == '-' && i + 1 < text.size() && text[i + 1] >= '0' &&
                        text[i + 1] <= '9');
    if (!start || (i > 0 && (std::isalnum(static_cast<unsigned char>(text[i - 1])) ||
                             text[i - 1] == '_' || text[i - 1] == '.'))) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < text.size() && (std::isdigit(static_cast<unsigned char>(text[j])) ||
                               text[j] == '.' || text[j] == 'e' || text[j] == 'E' ||
                               text[j] == '+' || text[j] == '-')) {
      ++j;
    }
    spans.emplace_back(i, j - i);
    i = j;
  }
  return spans;
}

// Every leaf (and container) of a JSON document, as pointers.
void CollectPointers(const nlohmann::json& j, const nlohmann::json::json_pointer& at,
                     std::vector<nlohmann::json::json_pointer>* out) {
  out->push_back(at);
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) CollectPointers(*it, at / it.key(), out);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) CollectPointers(j[i], at / i, out);
  }
}

// Mutation `index` of `text` (JSON when `json`), deterministic.
std::string Mutate(const std::string& text, bool json, int index) {
  std::mt19937_64 rng(static_cast<uint64_t>(index) * 7919 + text.size());
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % std::max<size_t>(n, 1)); };
  const int kind = index % 7;
  if (kind == 0) return text.substr(0, pick(text.size()));  // truncated
  if (kind == 1) {  // garbage bytes
    std::string out = text;
    for (int k = 0; k < 1 + static_cast<int>(pick(4)); ++k) {
      if (out.empty()) break;
      out[pick(out.size())] = static_cast<char>(rng() & 0xff);
    }
    return out;
  }
  if (kind == 2 || !json) {  // a number replaced in the text
    const auto spans = NumberSpans(text);
    if (spans.empty()) return text + "\x01";
    const auto [at, length] = spans[pick(spans.size())];
    const std::string value = json ? HostileValues()[pick(HostileValues().size())]
                                   : std::vector<std::string>{"-1", "1e400", "nan", "x", "",
                                                              "99999999999999999999"}[pick(6)];
    return text.substr(0, at) + value + text.substr(at + length);
  }
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded()) return text;
  std::vector<nlohmann::json::json_pointer> pointers;
  CollectPointers(doc, nlohmann::json::json_pointer(), &pointers);
  const nlohmann::json::json_pointer target = pointers[pick(pointers.size())];
  if (kind == 3 && !target.empty()) {  // a field or element removed
    nlohmann::json& parent = doc[target.parent_pointer()];
    if (parent.is_object()) parent.erase(target.back());
    if (parent.is_array() && !parent.empty()) parent.erase(parent.begin() + pick(parent.size()));
    return doc.dump();
  }
  if (kind == 4) {  // a value of another type or range (text, for 1e400)
    const std::string marker = "\"__hostile__\"";
    doc[target] = "__hostile__";
    std::string out = doc.dump();
    const size_t at = out.find(marker);
    return out.substr(0, at) + HostileValues()[pick(HostileValues().size())] +
           out.substr(at + marker.size());
  }
  if (kind == 5) {  // an object's first field duplicated with another value, or an array grown
    nlohmann::json& node = doc[target];
    if (node.is_array() && !node.empty()) {
      for (int k = 0; k < 3; ++k) node.push_back(node[pick(node.size())]);
      return doc.dump();
    }
    std::string out = doc.dump();
    const size_t brace = out.find('{', pick(out.size()));
    if (brace == std::string::npos || brace + 1 >= out.size() || out[brace + 1] != '"') {
      return out;
    }
    const size_t key_end = out.find('"', brace + 2);
    return out.substr(0, brace + 1) + out.substr(brace + 1, key_end - brace) + ":" +
           HostileValues()[pick(HostileValues().size())] + "," + out.substr(brace + 1);
  }
  // kind 6: the whole document replaced by a value of another shape.
  return std::vector<std::string>{"[]", "{}", "null", "7", "\"plan\"", ""}[pick(6)];
}

bool IsBadInputCode(absl::StatusCode code) {
  return code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound ||
         code == absl::StatusCode::kOutOfRange || code == absl::StatusCode::kDataLoss ||
         code == absl::StatusCode::kResourceExhausted;
}

// Runs kCasesPerFormat mutations of `seed` through `parse`; returns how many were rejected.
int FuzzFormat(const std::string& name, const std::string& seed, bool json,
               const std::function<absl::Status(const std::string&)>& parse) {
  EXPECT_TRUE(parse(seed).ok()) << name << ": the unmutated input must parse: "
                                << parse(seed);
  int rejected = 0;
  for (int i = 0; i < kCasesPerFormat; ++i) {
    const std::string input = Mutate(seed, json, i);
    absl::Status s;
    try {
      s = parse(input);
    } catch (const std::exception& e) {
      ADD_FAILURE() << name << " case " << i << ": exception escaped: " << e.what()
                    << "\ninput: " << input.substr(0, 400);
      continue;
    }
    if (s.ok()) continue;
    ++rejected;
    EXPECT_TRUE(IsBadInputCode(s.code())) << name << " case " << i << ": " << s;
    EXPECT_FALSE(s.message().empty()) << name << " case " << i;
    EXPECT_EQ(s.message().find('\n'), absl::string_view::npos) << name << " case " << i << ": "
                                                                << s;
  }
  return rejected;
}

absl::StatusOr<nlohmann::json> Parse(const std::string& text) { return ParseJson(text, "input"); }

pipeline::ScheduleSpec Spec() {
  pipeline::ScheduleSpec spec;
  spec.kind = pipeline::ScheduleKind::k1F1B;
  spec.num_ranks = 2;
  spec.num_microbatches = 4;
  return spec;
}

std::string Data(const std::string& relative) {
  auto text = ReadFile(absl::StrCat(TANDEM_TEST_DATA_DIR, "/", relative));
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

// Asserts that each format rejects a good share of its mutations (the test tests something).
void ExpectRejected(const std::string& name, int rejected) {
  EXPECT_GE(rejected, kCasesPerFormat / 3) << name << ": only " << rejected << " of "
                                           << kCasesPerFormat << " mutations were rejected";
}

TEST(InputFuzzTest, PlanScheduleCostsAndClusterFiles) {
  auto plan = pipeline::MakeUniformPlan(8, Spec(), /*data_parallel=*/2, /*microbatch_size=*/2);
  ASSERT_TRUE(plan.ok());
  ExpectRejected("plan", FuzzFormat("plan", pipeline::ToJson(*plan).dump(), true,
                                    [](const std::string& t) -> absl::Status {
                                      TANDEM_ASSIGN_OR_RETURN(nlohmann::json j, Parse(t));
                                      return pipeline::PlanFromJson(j).status();
                                    }));
  auto schedule = pipeline::GenerateSchedule(Spec());
  ASSERT_TRUE(schedule.ok());
  ExpectRejected("schedule", FuzzFormat("schedule", pipeline::ToJson(*schedule).dump(), true,
                                        [](const std::string& t) -> absl::Status {
                                          TANDEM_ASSIGN_OR_RETURN(nlohmann::json j, Parse(t));
                                          return pipeline::ScheduleFromJson(j).status();
                                        }));
  const std::string costs =
      R"({"forward": [0.01, 0.012], "backward": [0.02, 0.024], "activation_bytes": [1000, 1000],
          "latency_seconds": 1e-5, "bandwidth_bytes_per_second": 1e9,
          "grad_sync_seconds": [0.001, 0.001], "optimizer_seconds": 0.003})";
  ExpectRejected("costs", FuzzFormat("costs", costs, true, [](const std::string& t) {
                   auto j = Parse(t);
                   if (!j.ok()) return j.status();
                   return pipeline::CostModel::FromJson(*j, Spec()).status();
                 }));
  auto cluster = planner::MakeCluster(8, 4, 16e9, {100e9, 10e9});
  ASSERT_TRUE(cluster.ok());
  ExpectRejected("cluster", FuzzFormat("cluster", planner::ToJson(*cluster).dump(), true,
                                       [](const std::string& t) -> absl::Status {
                                         TANDEM_ASSIGN_OR_RETURN(nlohmann::json j, Parse(t));
                                         return planner::ClusterFromJson(j).status();
                                       }));
}

TEST(InputFuzzTest, ProfilesInEveryFormat) {
  const std::string graph = Data("pipedream/vgg16.graph.txt");
  ExpectRejected("pipedream", FuzzFormat("pipedream", graph, false, [](const std::string& t) {
                   return planner::ImportPipeDreamGraph(t, "graph.txt").status();
                 }));
  auto profile = planner::ImportPipeDreamGraph(graph, "graph.txt");
  ASSERT_TRUE(profile.ok());
  ExpectRejected("profile", FuzzFormat("profile", pipeline::ToJson(*profile).dump(), true,
                                       [](const std::string& t) -> absl::Status {
                                         TANDEM_ASSIGN_OR_RETURN(nlohmann::json j, Parse(t));
                                         return pipeline::ProfileFromJson(j).status();
                                       }));
  ExpectRejected("piper", FuzzFormat("piper", Data("piper/bert32a100.json"), true,
                                     [](const std::string& t) -> absl::Status {
                                       TANDEM_ASSIGN_OR_RETURN(nlohmann::json j, Parse(t));
                                       return planner::ImportPiperJson(j, "piper").status();
                                     }));
  ExpectRejected("metis", FuzzFormat("metis", Data("metis/gpt3_a100_tp1_bs1.json"), true,
                                     [](const std::string& t) -> absl::Status {
                                       TANDEM_ASSIGN_OR_RETURN(nlohmann::json j, Parse(t));
                                       return planner::ImportMetisJson(j, "metis").status();
                                     }));
}

// Schedules in torch.distributed.pipelining's CSV format (`tandem schedule --from-csv`,
// `tandem train --schedule-file`), as torch writes them: compute-only and lowered.
TEST(InputFuzzTest, TorchCsvSchedules) {
  for (const char* name : {"torch_schedules/zbv_p2_m4.csv", "torch_schedules/zbv_p2_m4_comms.csv",
                           "torch_schedules/dualpipev_p4_m8.csv"}) {
    ExpectRejected(name, FuzzFormat(name, Data(name), /*json=*/false, [](const std::string& t) {
                     return pipeline::ParseTorchCsvSchedule(t, "input.csv").status();
                   }));
  }
}

// Hugging Face tokenizer.json files in Llama 3's layout (Split and ByteLevel, a template) and
// in Llama 2's (normalizers, byte fallback, a decoder sequence; with Gemma's Split by a string):
// a mutation that reads is then used, encoding and decoding a text of every kind of character.
std::string TokenizerSeed(bool sentencepiece) {
  nlohmann::json vocab = nlohmann::json::object();
  int next = 0;
  const std::string meta = "\xE2\x96\x81";  // SentencePiece's space
  for (const std::string& token :
       {std::string("<s>"), std::string("</s>"), std::string("<unk>"), std::string("a"),
        std::string("b"), std::string("c"), std::string(" "), std::string("ab"), meta, meta + "a",
        std::string("<0x0A>"), std::string("<0xC3>"), std::string("<0xA9>"),
        std::string("\xC4\xA0"), std::string("1")}) {
    vocab[token] = next++;
  }
  nlohmann::json json = {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 0}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
        {{"id", 1}, {"content", "</s>"}, {"special", true}, {"normalized", false}}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", {"a b", "\xE2\x96\x81 a"}},
        {"unk_token", "<unk>"},
        {"byte_fallback", sentencepiece},
        {"fuse_unk", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {0}}, {"tokens", {"<s>"}}}}}}}}};
  if (sentencepiece) {
    json["normalizer"] = {
        {"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}};
    // Gemma's pre-tokenizer: a Split by a string (mutations give it other strings and
    // behaviors).
    json["pre_tokenizer"] = {{"type", "Split"},
                             {"pattern", {{"String", " "}}},
                             {"behavior", "MergedWithPrevious"},
                             {"invert", false}};
    json["decoder"] = {
        {"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  } else {
    json["normalizer"] = {{"type", "NFC"}};
    json["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern",
            {{"Regex",
              "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
              "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    json["decoder"] = {{"type", "ByteLevel"}};
  }
  return json.dump();
}

TEST(InputFuzzTest, TokenizerFiles) {
  for (const bool sentencepiece : {false, true}) {
    const std::string name =
        sentencepiece ? "tokenizer (Llama 2, Gemma's split)" : "tokenizer (Llama 3)";
    ExpectRejected(
        name, FuzzFormat(name, TokenizerSeed(sentencepiece), true,
                         [](const std::string& t) -> absl::Status {
                           TANDEM_ASSIGN_OR_RETURN(const data::Tokenizer tokenizer,
                                                   data::Tokenizer::FromJson(t, "tokenizer.json"));
                           for (const bool special : {false, true}) {
                             TANDEM_ASSIGN_OR_RETURN(const std::vector<int64_t> ids,
                                                     tokenizer.Encode("<s>ab c 1234 caf\xC3\xA9 "
                                                                      "e\xCC\x81 \xF0\x9F\x91\x8D\n"
                                                                      "</s> abab",
                                                                      special));
                             tokenizer.Decode(ids, special);
                           }
                           return absl::OkStatus();
                         }));
  }
}

TEST(InputFuzzTest, CheckpointManifestsAndShards) {
  runtime::CheckpointManifest manifest;
  manifest.model = "gpt L=2";
  manifest.step = 12;
  manifest.plan = nlohmann::json::object();
  manifest.optimizer = {{"kind", "adamw"}};
  runtime::ShardRecord record;
  record.stage = 0;
  record.file = runtime::ShardFileName(0, 0, 1);
  record.bytes = 100;
  record.checksum = runtime::Checksum("x");
  manifest.shards.push_back(record);
  ExpectRejected("manifest",
                 FuzzFormat("manifest", runtime::ToJson(manifest).dump(), true,
                            [](const std::string& t) -> absl::Status {
                              TANDEM_ASSIGN_OR_RETURN(nlohmann::json j, Parse(t));
                              return runtime::ManifestFromJson(j, "manifest.json").status();
                            }));
  runtime::CheckpointShard shard;
  shard.stage = 1;
  shard.metadata = {{"optimizer_steps", {{"w", 3}}}};
  runtime::ShardTensor tensor;
  tensor.name = "param:w";
  tensor.dtype = comm::DataType::kFloat32;
  tensor.count = 4;
  tensor.bytes.assign(16, '\x01');
  shard.tensors.push_back(tensor);
  ExpectRejected("shard", FuzzFormat("shard", runtime::SerializeShard(shard), false,
                                     [](const std::string& t) {
                                       return runtime::ParseShard(t, "shard").status();
                                     }));
}

// A crafted tensor count whose byte size overflows 64 bits.
TEST(InputFuzzTest, ShardCountThatOverflowsIsCorrupt) {
  runtime::CheckpointShard shard;
  runtime::ShardTensor tensor;
  tensor.name = "param:w";
  tensor.dtype = comm::DataType::kFloat32;
  tensor.count = 4;
  tensor.bytes.assign(16, '\x01');
  shard.tensors.push_back(tensor);
  std::string bytes = runtime::SerializeShard(shard);
  const std::string from = "\"count\":4";
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos);
  // 2^62 elements of 4 bytes: 2^64 bytes, 0 after overflow.
  const std::string to = "\"count\":4611686018427387904";
  bytes.replace(at, from.size(), to);
  // The header's length (a uint64) sits just before the header's JSON.
  const size_t length_at = bytes.find('{') - sizeof(uint64_t);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data() + length_at, sizeof(header_size));
  header_size += to.size() - from.size();
  std::memcpy(bytes.data() + length_at, &header_size, sizeof(header_size));
  auto parsed = runtime::ParseShard(bytes, "shard");
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss) << parsed.status();
  EXPECT_NE(parsed.status().message().find("runs past the end"), std::string::npos)
      << parsed.status();
}

TEST(InputFuzzTest, OutOfRangeNumberIsOneLine) {
  auto j = ParseJson(R"({"forward": [1e400]})", "costs.json");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(j.status().message().find("costs.json"), std::string::npos) << j.status();
}

// ---- Through the program -------------------------------------------------------------------

struct ProgramRun {
  int exit_code = -1;
  std::string err;
};

// Runs `tandem ARGS` (a shell command line), capturing stderr.
ProgramRun Tandem(const std::string& args) {
  const std::string err_path =
      absl::StrCat(testing::TempDir(), "/fuzz_stderr_", ::getpid(), ".txt");
  const std::string command = absl::StrCat(g_tandem, " ", args, " >/dev/null 2>", err_path);
  const int status = std::system(command.c_str());
  ProgramRun run;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  auto err = ReadFile(err_path);
  if (err.ok()) run.err = *err;
  std::filesystem::remove(err_path);
  return run;
}

int Lines(const std::string& text) {
  int n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

class ProgramTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (g_tandem.empty()) GTEST_SKIP() << "no tandem program given";
    dir_ = absl::StrCat(testing::TempDir(), "/tandem_fuzz_", ::getpid());
    tandem::RemoveAll(dir_).IgnoreError();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { tandem::RemoveAll(dir_).IgnoreError(); }
  std::string dir_;
};

constexpr char kSchedule[] = "schedule --schedule 1f1b --stages 2 --microbatches 4";

TEST_F(ProgramTest, MutatedInputsExitTwoWithOneLineAndWriteNothing) {
  const std::string costs =
      R"({"forward": [0.01, 0.012], "backward": [0.02, 0.024], "optimizer_seconds": 0.003})";
  const std::string graph = Data("pipedream/vgg16.graph.txt");
  int rejected = 0;
  constexpr int kCases = 14;  // per format: each case starts the program once
  for (int i = 0; i < 2 * kCases; ++i) {
    const bool schedule = i < kCases;
    const std::string input_path = absl::StrCat(dir_, "/input");
    const std::string out = absl::StrCat(dir_, "/out.json");
    ASSERT_TRUE(WriteFileAtomically(input_path, schedule ? Mutate(costs, true, i)
                                                         : Mutate(graph, false, i))
                    .ok());
    const ProgramRun run =
        schedule ? Tandem(absl::StrCat(kSchedule, " --costs ", input_path, " --output ", out))
                 : Tandem(absl::StrCat("plan --profile ", input_path,
                                       " --profile-format pipedream --algorithm pipedream "
                                       "--devices 4 --memory 64GiB -o ", out));
    EXPECT_TRUE(run.exit_code == 0 || run.exit_code == 2)
        << "case " << i << ": exit " << run.exit_code << "\n" << run.err;
    if (run.exit_code == 2) {
      ++rejected;
      EXPECT_EQ(Lines(run.err), 1) << "case " << i << ":\n" << run.err;
      EXPECT_FALSE(std::filesystem::exists(out)) << "case " << i;
    }
    std::filesystem::remove(out);
  }
  EXPECT_GE(rejected, kCases / 2);
}

// JSON nested 50,000 deep (a Piper file of nested objects): one line and exit 2, not a crash
// of whatever walks, copies or prints the nested value.
TEST_F(ProgramTest, DeeplyNestedJsonExitsTwoWithOneLine) {
  const std::string path = absl::StrCat(dir_, "/nested.json");
  std::string text;
  for (int i = 0; i < 50000; ++i) text += "{\"a\":";
  text += "1";
  text += std::string(50000, '}');
  ASSERT_TRUE(WriteFileAtomically(path, text).ok());
  for (const std::string& args :
       {absl::StrCat("plan --profile ", path, " --profile-format piper --algorithm piper"),
        absl::StrCat("plan --profile ", path, " --algorithm pipedream --devices 4")}) {
    SCOPED_TRACE(args);
    const ProgramRun run = Tandem(args);
    EXPECT_EQ(run.exit_code, 2) << run.err;
    EXPECT_EQ(Lines(run.err), 1) << run.err;
    EXPECT_NE(run.err.find("nested 50000 levels deep"), std::string::npos) << run.err;
  }
  EXPECT_EQ(JsonNestingDepth(R"({"a": "[[[{{{", "b": [[1], {"c": []}]})"), 4);
  EXPECT_EQ(JsonNestingDepth(R"(["\"[", [2]])"), 2);
}

// Small inputs that ask for unbounded work are refused within seconds, naming the limit: a
// 100,000-layer chain graph and a cluster of a million devices for PipeDream.
TEST_F(ProgramTest, SearchesTooLargeForThePlannerExitTwoQuickly) {
  const std::string chain = absl::StrCat(dir_, "/chain.graph.txt");
  std::string text;
  constexpr int kLayers = 100000;
  for (int i = 0; i < kLayers; ++i) {
    absl::StrAppend(&text, "node", i, " -- Layer", i, " -- forward_compute_time=1.0, ",
                    "backward_compute_time=2.0, activation_size=1000.0, parameter_size=100.0\n");
  }
  for (int i = 0; i + 1 < kLayers; ++i) absl::StrAppend(&text, "\tnode", i, " -- node", i + 1, "\n");
  ASSERT_TRUE(WriteFileAtomically(chain, text).ok());
  const std::string cluster = absl::StrCat(dir_, "/cluster.json");
  ASSERT_TRUE(WriteFileAtomically(cluster, R"({"nodes": 1, "devices_per_node": 1000000,
      "device_memory": "80GiB", "levels": [{"bandwidth": 1e11}]})").ok());
  for (const std::string& args :
       {absl::StrCat("plan --profile ", chain, " --profile-format pipedream",
                     " --algorithm pipedream --devices 4"),
        absl::StrCat("plan --profile ", TANDEM_TEST_DATA_DIR, "/pipedream/vgg16.graph.txt",
                     " --profile-format pipedream --algorithm pipedream --cluster ", cluster)}) {
    SCOPED_TRACE(args);
    const auto start = std::chrono::steady_clock::now();
    const ProgramRun run = Tandem(args);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(run.exit_code, 2) << run.err;
    EXPECT_EQ(Lines(run.err), 1) << run.err;
    EXPECT_NE(run.err.find("is too large"), std::string::npos) << run.err;
    EXPECT_LT(seconds, 20.0);
  }
}

TEST_F(ProgramTest, OutputThatIsADirectoryExitsTwo) {
  const ProgramRun run = Tandem(absl::StrCat(kSchedule, " --output ", dir_));
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_EQ(Lines(run.err), 1) << run.err;
  EXPECT_NE(run.err.find("is a directory"), std::string::npos) << run.err;
}

TEST_F(ProgramTest, OutputThroughASymbolicLinkKeepsTheLink) {
  const std::string target = absl::StrCat(dir_, "/real.json");
  const std::string link = absl::StrCat(dir_, "/link.json");
  ASSERT_TRUE(WriteFileAtomically(target, "old").ok());
  std::filesystem::create_symlink("real.json", link);  // relative, as users make them
  const ProgramRun run = Tandem(absl::StrCat(kSchedule, " --output ", link));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  auto written = ReadFile(target);
  ASSERT_TRUE(written.ok());
  EXPECT_NE(written->find("programs"), std::string::npos);
  // A dangling link gets its target created.
  const std::string dangling = absl::StrCat(dir_, "/dangling.json");
  std::filesystem::create_symlink("new.json", dangling);
  ASSERT_EQ(Tandem(absl::StrCat(kSchedule, " --output ", dangling)).exit_code, 0);
  EXPECT_TRUE(std::filesystem::is_symlink(dangling));
  EXPECT_TRUE(std::filesystem::is_regular_file(absl::StrCat(dir_, "/new.json")));
}

TEST_F(ProgramTest, OutputToAFifoIsWrittenNotReplaced) {
  const std::string fifo = absl::StrCat(dir_, "/pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string received;
  std::thread reader([&] {
    auto text = ReadFile(fifo);  // blocks until the writer opens and closes it
    if (text.ok()) received = *text;
  });
  const ProgramRun run = Tandem(absl::StrCat(kSchedule, " --output ", fifo));
  reader.join();
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(received.find("programs"), std::string::npos);
  struct stat st;
  ASSERT_EQ(::stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(std::filesystem::directory_iterator(dir_)->path().filename(), "pipe");  // no temp
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc > 1) tandem::g_tandem = argv[1];
  return RUN_ALL_TESTS();
}
