// Token shards: each format read back token for token (files written from the documented
// layouts here, and by Python: llm.c's and Megatron's layouts with struct, nanoGPT's and
// llm.c's with numpy where it is installed); data-set assembly from folders, patterns and
// lists; every refusal with its code and the file it names; the vocabulary scan; the data
// set's identity; sample windows.
#include "data/token_dataset.h"

#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "data/dataset_identity.h"
#include "data/sample_windows.h"
#include "gtest/gtest.h"
#include "tests/tokens/token_files.h"

namespace tandem::data {
namespace {

using testing::LlmcBytes;
using testing::MegatronBytes;
using testing::NanoGptBytes;
using testing::TemporaryFolder;
using testing::TestTokens;
using testing::WriteBytes;
using testing::WriteMegatron;

constexpr int64_t kGpt2Vocabulary = 50257;

std::vector<int64_t> ReadAll(const TokenDataset& dataset) {
  std::vector<int64_t> tokens(static_cast<size_t>(dataset.num_tokens()));
  const absl::Status status = dataset.ReadTokens(0, absl::MakeSpan(tokens));
  EXPECT_TRUE(status.ok()) << status;
  return tokens;
}

std::vector<int64_t> Concatenate(const std::vector<std::vector<int64_t>>& pieces) {
  std::vector<int64_t> all;
  for (const auto& piece : pieces) all.insert(all.end(), piece.begin(), piece.end());
  return all;
}

// The error of opening `source`, which must fail with `code` and a message holding `needle`.
void ExpectRefused(const std::string& source, absl::StatusCode code, const std::string& needle,
                   TokenDatasetOptions options = {}) {
  auto dataset = TokenDataset::Open(source, options);
  ASSERT_FALSE(dataset.ok()) << source << " was accepted";
  EXPECT_EQ(dataset.status().code(), code) << dataset.status();
  EXPECT_NE(dataset.status().message().find(needle), std::string::npos)
      << "message \"" << dataset.status().message() << "\" lacks \"" << needle << "\"";
}

// ---- Formats -------------------------------------------------------------------------------

TEST(TokenDatasetTest, ReadsLlmcVersionOneAndTwo) {
  TemporaryFolder folder;
  const std::vector<int64_t> small = TestTokens(1, 3000, kGpt2Vocabulary);
  const std::vector<int64_t> large = TestTokens(2, 2000, 128256);  // Llama 3's vocabulary
  WriteBytes(folder.File("v1.bin"), LlmcBytes(small, 1));
  WriteBytes(folder.File("v2.bin"), LlmcBytes(large, 2));

  auto v1 = TokenDataset::Open(folder.File("v1.bin"));
  ASSERT_TRUE(v1.ok()) << v1.status();
  EXPECT_EQ(v1->shard(0).format, TokenFileFormat::kLlmc);
  EXPECT_EQ(v1->shard(0).token_type, TokenType::kUint16);
  EXPECT_EQ(v1->num_tokens(), 3000);
  EXPECT_EQ(ReadAll(*v1), small);

  auto v2 = TokenDataset::Open(folder.File("v2.bin"));
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->shard(0).token_type, TokenType::kUint32);
  EXPECT_EQ(ReadAll(*v2), large);
  EXPECT_GT(*std::max_element(large.begin(), large.end()), 65535);
}

TEST(TokenDatasetTest, ReadsHeaderlessNanoGptUint16) {
  TemporaryFolder folder;
  const std::vector<int64_t> tokens = TestTokens(3, 4097, kGpt2Vocabulary);
  WriteBytes(folder.File("train.bin"), NanoGptBytes(tokens));
  auto dataset = TokenDataset::Open(folder.File("train.bin"));
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->shard(0).format, TokenFileFormat::kNanoGpt);
  EXPECT_EQ(dataset->shard(0).num_documents, 0);
  EXPECT_EQ(ReadAll(*dataset), tokens);
}

TEST(TokenDatasetTest, ReadsMegatronUint16AndInt32WithTheirDocuments) {
  TemporaryFolder folder;
  const std::vector<std::vector<int64_t>> documents = {
      TestTokens(4, 700, kGpt2Vocabulary), TestTokens(5, 0, kGpt2Vocabulary),
      TestTokens(6, 33, kGpt2Vocabulary), TestTokens(7, 1200, kGpt2Vocabulary)};
  for (int dtype_code : {8, 4}) {
    for (int sequences_per_document : {1, 3}) {
      for (bool modes : {false, true}) {
        SCOPED_TRACE(absl::StrCat("dtype ", dtype_code, ", ", sequences_per_document,
                                  " sequences a document, modes ", modes));
        const std::string prefix =
            folder.File(absl::StrCat("corpus_", dtype_code, "_", sequences_per_document, modes));
        WriteMegatron(prefix, MegatronBytes(documents, dtype_code, sequences_per_document, modes));
        auto dataset = TokenDataset::Open(prefix);  // a prefix, as Megatron users give it
        ASSERT_TRUE(dataset.ok()) << dataset.status();
        const TokenShardInfo& shard = dataset->shard(0);
        EXPECT_EQ(shard.format, TokenFileFormat::kMegatron);
        EXPECT_EQ(shard.token_type, dtype_code == 8 ? TokenType::kUint16 : TokenType::kInt32);
        EXPECT_EQ(shard.path, prefix + ".bin");
        EXPECT_EQ(shard.index_path, prefix + ".idx");
        ASSERT_EQ(shard.num_documents, 4);
        EXPECT_EQ(ReadAll(*dataset), Concatenate(documents));
        EXPECT_EQ(dataset->DocumentTokens(0, 0), (TokenRange{0, 700}));
        EXPECT_EQ(dataset->DocumentTokens(0, 1), (TokenRange{700, 700}));
        EXPECT_EQ(dataset->DocumentTokens(0, 2), (TokenRange{700, 733}));
        EXPECT_EQ(dataset->DocumentTokens(0, 3), (TokenRange{733, 1933}));
      }
    }
  }
}

TEST(TokenDatasetTest, AForcedFormatOverridesDetection) {
  TemporaryFolder folder;
  // A nanoGPT file whose first two tokens spell llm.c's magic: detection takes it for llm.c
  // and refuses its header; forcing nanoGPT reads it.
  std::vector<int64_t> tokens = TestTokens(8, 100, kGpt2Vocabulary);
  tokens[0] = 20240520 & 0xFFFF;
  tokens[1] = 20240520 >> 16;
  WriteBytes(folder.File("odd.bin"), NanoGptBytes(tokens));
  ExpectRefused(folder.File("odd.bin"), absl::StatusCode::kDataLoss, "odd.bin");
  TokenDatasetOptions nanogpt;
  nanogpt.format = TokenFileFormat::kNanoGpt;
  auto forced = TokenDataset::Open(folder.File("odd.bin"), nanogpt);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_EQ(ReadAll(*forced), tokens);

  // A Megatron pair read as a headerless file, the .idx ignored.
  WriteMegatron(folder.File("mega"), MegatronBytes({TestTokens(9, 50, 1000)}));
  auto raw = TokenDataset::Open(folder.File("mega.bin"), nanogpt);
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(raw->shard(0).format, TokenFileFormat::kNanoGpt);
  EXPECT_EQ(raw->num_tokens(), 50);

  EXPECT_EQ(*ParseTokenFileFormat("llm.c"), TokenFileFormat::kLlmc);
  EXPECT_EQ(*ParseTokenFileFormat("Megatron"), TokenFileFormat::kMegatron);
  EXPECT_EQ(ParseTokenFileFormat("parquet").status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- Files written by Python -----------------------------------------------------------------

TEST(TokenDatasetTest, ReadsLlmcAndMegatronWrittenByPythonFromTheDocumentedLayouts) {
  if (!testing::HavePython()) GTEST_SKIP() << "python3 is not installed";
  TemporaryFolder folder;
  ASSERT_EQ(testing::RunTokenWriter(absl::StrCat("llmc ", folder.File("py_v1.bin"),
                                                 " --count 5000 --stream 11 --vocab 50257")),
            0);
  ASSERT_EQ(testing::RunTokenWriter(absl::StrCat("llmc ", folder.File("py_v2.bin"),
                                                 " --count 3000 --stream 12 --vocab 128256 "
                                                 "--version 2")),
            0);
  ASSERT_EQ(testing::RunTokenWriter(absl::StrCat("megatron ", folder.File("py_mega"),
                                                 " --documents 100,0,2500,7 --stream 13 "
                                                 "--vocab 100000 --dtype int32")),
            0);
  auto llmc = TokenDataset::Open(
      std::vector<std::string>{folder.File("py_v1.bin"), folder.File("py_v2.bin")});
  ASSERT_TRUE(llmc.ok()) << llmc.status();
  EXPECT_EQ(ReadAll(*llmc),
            Concatenate({TestTokens(11, 5000, 50257), TestTokens(12, 3000, 128256)}));
  auto megatron = TokenDataset::Open(folder.File("py_mega"));
  ASSERT_TRUE(megatron.ok()) << megatron.status();
  EXPECT_EQ(ReadAll(*megatron), TestTokens(13, 2607, 100000));
  EXPECT_EQ(megatron->shard(0).num_documents, 4);
  EXPECT_EQ(megatron->DocumentTokens(0, 2), (TokenRange{100, 2600}));
}

TEST(TokenDatasetTest, ReadsNanoGptAndLlmcFilesWrittenWithNumpy) {
  if (!testing::HavePython() || !testing::HaveNumpy()) {
    GTEST_SKIP() << "numpy is not installed for python3: the files nanoGPT's prepare.py and "
                    "llm.c's write_datafile write with numpy cannot be made here";
  }
  TemporaryFolder folder;
  ASSERT_EQ(testing::RunTokenWriter(
                absl::StrCat("nanogpt ", folder.File("np.bin"), " --count 6001 --stream 14")),
            0);
  ASSERT_EQ(testing::RunTokenWriter(absl::StrCat("llmc ", folder.File("np_llmc.bin"),
                                                 " --count 4000 --stream 15 --writer numpy")),
            0);
  auto nanogpt = TokenDataset::Open(folder.File("np.bin"));
  ASSERT_TRUE(nanogpt.ok()) << nanogpt.status();
  EXPECT_EQ(nanogpt->shard(0).format, TokenFileFormat::kNanoGpt);
  EXPECT_EQ(ReadAll(*nanogpt), TestTokens(14, 6001, kGpt2Vocabulary));
  auto llmc = TokenDataset::Open(folder.File("np_llmc.bin"));
  ASSERT_TRUE(llmc.ok()) << llmc.status();
  EXPECT_EQ(llmc->shard(0).format, TokenFileFormat::kLlmc);
  EXPECT_EQ(ReadAll(*llmc), TestTokens(15, 4000, kGpt2Vocabulary));
}

// ---- Data sets of several shards ---------------------------------------------------------------

TEST(TokenDatasetTest, FoldersAndPatternsAreSortedAndListsKeepTheirOrder) {
  TemporaryFolder folder;
  const std::vector<int64_t> a = TestTokens(20, 300, 1000);
  const std::vector<int64_t> b = TestTokens(21, 200, 1000);
  const std::vector<int64_t> c = TestTokens(22, 100, 1000);
  WriteBytes(folder.File("shard_001.bin"), LlmcBytes(b));
  WriteBytes(folder.File("shard_000.bin"), LlmcBytes(a));
  WriteMegatron(folder.File("shard_002"), MegatronBytes({c}));
  WriteBytes(folder.File("README.txt"), "not tokens");

  auto whole = TokenDataset::Open(folder.path());
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ(whole->num_shards(), 3);
  EXPECT_EQ(whole->shard(2).format, TokenFileFormat::kMegatron);
  EXPECT_EQ(whole->num_tokens(), 600);
  EXPECT_EQ(ReadAll(*whole), Concatenate({a, b, c}));
  EXPECT_EQ(whole->shard(1).first_token, 300);
  EXPECT_EQ(whole->ShardOf(299), 0);
  EXPECT_EQ(whole->ShardOf(300), 1);
  EXPECT_EQ(whole->ShardOf(599), 2);

  auto pattern = TokenDataset::Open(folder.File("shard_*"));  // matches .bin and .idx files
  ASSERT_TRUE(pattern.ok()) << pattern.status();
  EXPECT_EQ(pattern->identity(), whole->identity());

  auto listed = TokenDataset::Open(std::vector<std::string>{
      folder.File("shard_002.idx"), folder.File("shard_000.bin"), folder.File("shard_001.bin")});
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(ReadAll(*listed), Concatenate({c, a, b}));

  // A window read across shard boundaries.
  std::vector<int64_t> window(250);
  ASSERT_TRUE(whole->ReadTokens(290, absl::MakeSpan(window)).ok());
  const std::vector<int64_t> all = Concatenate({a, b, c});
  EXPECT_EQ(window, std::vector<int64_t>(all.begin() + 290, all.begin() + 540));
  EXPECT_EQ(whole->ReadTokens(590, absl::MakeSpan(window)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(whole->ReadTokens(-1, absl::MakeSpan(window)).code(), absl::StatusCode::kOutOfRange);

  auto twice =
      TokenDataset::Open(std::vector<std::string>{folder.path(), folder.File("shard_001.bin")});
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("listed twice"), std::string::npos);
}

TEST(TokenDatasetTest, EmptyShardsAreSkippedByGlobalOffsets) {
  TemporaryFolder folder;
  WriteBytes(folder.File("a.bin"), LlmcBytes(TestTokens(1, 10, 100)));
  WriteBytes(folder.File("b.bin"), LlmcBytes({}));
  WriteBytes(folder.File("c.bin"), NanoGptBytes(TestTokens(2, 5, 100)));
  auto dataset = TokenDataset::Open(folder.path());
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->ShardOf(10), 2);
  EXPECT_EQ(ReadAll(*dataset), Concatenate({TestTokens(1, 10, 100), TestTokens(2, 5, 100)}));
}

// ---- Refusals ----------------------------------------------------------------------------------

TEST(TokenDatasetTest, RefusesMalformedLlmcAndNanoGptFilesNamingThem) {
  TemporaryFolder folder;
  const std::string good = LlmcBytes(TestTokens(1, 100, 1000));

  std::string version = good;
  version[4] = 7;
  WriteBytes(folder.File("version.bin"), version);
  ExpectRefused(folder.File("version.bin"), absl::StatusCode::kInvalidArgument,
                "version.bin: unsupported llm.c version 7");

  WriteBytes(folder.File("short.bin"), good.substr(0, good.size() - 1));
  ExpectRefused(folder.File("short.bin"), absl::StatusCode::kDataLoss, "(truncated)");

  WriteBytes(folder.File("long.bin"), good + "xx");
  ExpectRefused(folder.File("long.bin"), absl::StatusCode::kDataLoss,
                "long.bin: the llm.c header promises 100 uint16 tokens");

  WriteBytes(folder.File("header.bin"), good.substr(0, 500));
  ExpectRefused(folder.File("header.bin"), absl::StatusCode::kDataLoss, "truncated llm.c header");

  std::string negative = good;
  negative[11] = static_cast<char>(0x80);
  WriteBytes(folder.File("negative.bin"), negative);
  ExpectRefused(folder.File("negative.bin"), absl::StatusCode::kDataLoss, "negative token count");

  TokenDatasetOptions llmc;
  llmc.format = TokenFileFormat::kLlmc;
  WriteBytes(folder.File("raw.bin"), NanoGptBytes(TestTokens(1, 600, 1000)));
  ExpectRefused(folder.File("raw.bin"), absl::StatusCode::kInvalidArgument, "raw.bin: bad magic",
                llmc);

  WriteBytes(folder.File("odd.bin"), "abc");
  ExpectRefused(folder.File("odd.bin"), absl::StatusCode::kDataLoss,
                "odd.bin: 3 bytes is not a whole number of uint16 tokens");
}

TEST(TokenDatasetTest, RefusesMalformedMegatronIndexesNamingThem) {
  TemporaryFolder folder;
  const std::vector<std::vector<int64_t>> documents = {TestTokens(1, 40, 1000),
                                                       TestTokens(2, 60, 1000)};
  const testing::MegatronFileBytes good = MegatronBytes(documents);
  // Offsets in the .idx: magic 0, version 9, dtype 17, sequences 18, entries 26, lengths 34,
  // pointers 34 + 4 * 2 = 42, document indices 42 + 8 * 2 = 58.
  struct Case {
    std::string name;
    int offset;
    std::string bytes;  // written at offset; empty: the .idx is cut at offset
    absl::StatusCode code;
    std::string needle;
  };
  auto u64 = [](uint64_t value) { return std::string(reinterpret_cast<char*>(&value), 8); };
  const std::vector<Case> cases = {
      {"magic", 0, "NOTMAGIC!", absl::StatusCode::kInvalidArgument, "bad magic"},
      {"version", 9, u64(2), absl::StatusCode::kInvalidArgument, "index version 2"},
      {"int64", 17, std::string(1, 5), absl::StatusCode::kInvalidArgument,
       "unsupported token dtype int64 (code 5)"},
      {"float32", 17, std::string(1, 7), absl::StatusCode::kInvalidArgument, "dtype float32"},
      {"unknown", 17, std::string(1, 99), absl::StatusCode::kInvalidArgument, "code 99"},
      {"header", 20, "", absl::StatusCode::kDataLoss, "truncated Megatron index"},
      {"cut", 60, "", absl::StatusCode::kDataLoss, "do not fit"},
      {"more_sequences", 18, u64(3), absl::StatusCode::kDataLoss, "counts 3 sequences"},
      {"huge_count", 18, u64(~0ULL >> 1), absl::StatusCode::kDataLoss, "do not fit"},
      {"negative_length", 34, std::string("\xff\xff\xff\xff", 4), absl::StatusCode::kDataLoss,
       "negative length"},
      {"long_sequence", 38, std::string("\x00\x10\x00\x00", 4), absl::StatusCode::kDataLoss,
       "ends past the 200 bytes"},
      {"short_sequence", 38, std::string("\x01\x00\x00\x00", 4), absl::StatusCode::kDataLoss,
       "describes 82 bytes"},
      {"pointer", 50, u64(1ULL << 40), absl::StatusCode::kDataLoss,
       "sequence 1 starts at byte 1099511627776"},
      {"first_document", 58, u64(1), absl::StatusCode::kDataLoss, "document index 0"},
      {"last_document", 74, u64(1), absl::StatusCode::kDataLoss, "the last document index"},
      {"falling_documents", 66, u64(5), absl::StatusCode::kDataLoss, "must rise"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string idx = good.idx;
    if (c.bytes.empty()) {
      idx.resize(c.offset);
    } else {
      idx.replace(c.offset, c.bytes.size(), c.bytes);
    }
    const std::string prefix = folder.File(c.name);
    WriteMegatron(prefix, {good.bin, idx});
    ExpectRefused(prefix + ".bin", c.code, c.needle);
    auto status = TokenDataset::Open(prefix + ".bin").status();
    EXPECT_NE(status.message().find(c.name), std::string::npos) << status;
  }
  // The .bin cut short of what the index describes, and longer than it.
  WriteMegatron(folder.File("cut_bin"), {good.bin.substr(0, 150), good.idx});
  ExpectRefused(folder.File("cut_bin.bin"), absl::StatusCode::kDataLoss,
                "cut_bin.idx: sequence 1 (60 tokens from byte 80) ends past the 150 bytes");
  WriteMegatron(folder.File("long_bin"), {good.bin + "zz", good.idx});
  ExpectRefused(folder.File("long_bin.bin"), absl::StatusCode::kDataLoss,
                "long_bin.bin: holds 202 bytes but its index");
  // A forced Megatron shard must be prefix.bin.
  TokenDatasetOptions megatron;
  megatron.format = TokenFileFormat::kMegatron;
  WriteBytes(folder.File("tokens.dat"), good.bin);
  ExpectRefused(folder.File("tokens.dat"), absl::StatusCode::kInvalidArgument,
                "does not end in .bin", megatron);
  // A .bin whose .idx is missing, forced.
  WriteBytes(folder.File("lonely.bin"), good.bin);
  ExpectRefused(folder.File("lonely.bin"), absl::StatusCode::kNotFound, "lonely.idx", megatron);
}

TEST(TokenDatasetTest, RefusesMissingPathsFoldersWithoutShardsAndSpecialFiles) {
  TemporaryFolder folder;
  ExpectRefused(folder.File("absent.bin"), absl::StatusCode::kNotFound, "absent.bin");
  ExpectRefused(folder.path(), absl::StatusCode::kNotFound, "holds no .bin token shards");
  ExpectRefused(folder.File("*.bin"), absl::StatusCode::kNotFound, "matches no token files");
  EXPECT_EQ(TokenDataset::Open(std::vector<std::string>{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A FIFO is refused at once, not waited on.
  ASSERT_EQ(::mkfifo(folder.File("pipe.bin").c_str(), 0600), 0);
  ExpectRefused(folder.File("pipe.bin"), absl::StatusCode::kInvalidArgument,
                "pipe.bin: not a regular file");
}

// ---- Vocabulary --------------------------------------------------------------------------------

TEST(TokenDatasetTest, VocabularyScanNamesTheFirstOffendingFileOffsetAndToken) {
  TemporaryFolder folder;
  std::vector<int64_t> second = TestTokens(2, 20000, 1000);
  second[12345] = 1500;
  second[15000] = 2000;
  WriteBytes(folder.File("a.bin"), LlmcBytes(TestTokens(1, 10000, 1000)));
  WriteBytes(folder.File("b.bin"), LlmcBytes(second));
  auto dataset = TokenDataset::Open(folder.path());
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_FALSE(dataset->CheckVocabulary(1501).ok());  // token 2000
  const absl::Status status = dataset->CheckVocabulary(1200);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), absl::StrCat(folder.File("b.bin"),
                                           ": token 12345 of the file (global offset 22345) "
                                           "is 1500, outside the vocabulary of 1200"));
  EXPECT_TRUE(dataset->CheckVocabulary(2001).ok());
  EXPECT_TRUE(dataset->CheckVocabulary(70000).ok());  // beyond any uint16
  EXPECT_EQ(dataset->CheckVocabulary(0).code(), absl::StatusCode::kInvalidArgument);

  // The lazy check on a window read.
  std::vector<int64_t> window(100);
  EXPECT_TRUE(dataset->ReadTokens(22300, absl::MakeSpan(window)).ok());
  const absl::Status lazy = dataset->ReadTokens(22300, absl::MakeSpan(window), 1200);
  EXPECT_EQ(lazy.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(lazy.message().find("b.bin: token 12345"), std::string::npos) << lazy;

  // Negative int32 tokens in a Megatron shard.
  std::vector<int64_t> tokens = TestTokens(3, 50, 1000);
  tokens[7] = -3;
  WriteMegatron(folder.File("m"), MegatronBytes({tokens}, /*dtype_code=*/4));
  auto megatron = TokenDataset::Open(folder.File("m"));
  ASSERT_TRUE(megatron.ok()) << megatron.status();
  const absl::Status negative = megatron->CheckVocabulary(1000);
  EXPECT_NE(negative.message().find("token 7 of the file (global offset 7) is -3, negative"),
            std::string::npos)
      << negative;
}

// ---- Identity ----------------------------------------------------------------------------------

TEST(TokenDatasetTest, IdentityIsStableAcrossPathsAndSeesChangedData) {
  TemporaryFolder folder;
  TemporaryFolder copy;
  const std::string a = LlmcBytes(TestTokens(1, 100000, 50000));
  const testing::MegatronFileBytes b = MegatronBytes({TestTokens(2, 3000, 50000)});
  WriteBytes(folder.File("a.bin"), a);
  WriteMegatron(folder.File("b"), b);
  WriteBytes(copy.File("a.bin"), a);
  WriteMegatron(copy.File("b"), b);
  auto original = TokenDataset::Open(folder.path());
  auto copied = TokenDataset::Open(std::vector<std::string>{copy.File("a.bin"), copy.File("b")});
  ASSERT_TRUE(original.ok() && copied.ok());
  const DatasetIdentity& identity = original->identity();
  EXPECT_EQ(identity, copied->identity());
  EXPECT_TRUE(CheckSameDataset(identity, copied->identity()).ok());
  ASSERT_EQ(identity.shards.size(), 2u);
  EXPECT_EQ(identity.shards[0].name, "a.bin");
  EXPECT_EQ(identity.shards[0].size_bytes, 1024 + 200000);
  EXPECT_EQ(identity.shards[1].size_bytes, static_cast<int64_t>(b.bin.size() + b.idx.size()));
  EXPECT_EQ(identity.num_tokens(), 103000);

  auto json = DatasetIdentity::FromJson(identity.ToJson(), "checkpoint.json: data");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(*json, identity);
  EXPECT_NE(identity.ToString().find("2 shards, 103000 tokens: a.bin 201024 bytes"),
            std::string::npos)
      << identity.ToString();

  // One token changed near either end of a shard: another checksum.
  for (size_t byte : {size_t{1024 + 10}, a.size() - 3}) {
    std::string changed = a;
    changed[byte] ^= 1;
    WriteBytes(copy.File("a.bin"), changed);
    auto reopened = TokenDataset::Open(copy.path());
    ASSERT_TRUE(reopened.ok());
    const absl::Status status = CheckSameDataset(identity, reopened->identity());
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(status.message().find("shard 0 a.bin has checksum"), std::string::npos) << status;
  }
  auto fewer = TokenDataset::Open(std::vector<std::string>{folder.File("b")});
  ASSERT_TRUE(fewer.ok());
  EXPECT_NE(
      CheckSameDataset(identity, fewer->identity()).message().find("has 2 shards, this one 1"),
      std::string::npos);

  nlohmann::json bad = identity.ToJson();
  bad["shards"][0]["checksum"] = "xyz";
  EXPECT_EQ(DatasetIdentity::FromJson(bad, "c").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(DatasetIdentity::FromJson(nlohmann::json::array(), "c").ok());
}

// ---- Sample windows ----------------------------------------------------------------------------

TEST(SampleWindowsTest, ContiguousWindowsStepBySequenceLengthAndNeverCrossShards) {
  TemporaryFolder folder;
  const std::vector<int64_t> a = TestTokens(1, 1000, 5000);
  const std::vector<int64_t> b = TestTokens(2, 257, 5000);
  WriteBytes(folder.File("a.bin"), LlmcBytes(a));
  WriteBytes(folder.File("b.bin"), NanoGptBytes(b));
  auto dataset = TokenDataset::Open(folder.path());
  ASSERT_TRUE(dataset.ok());
  SampleWindowOptions options;
  options.sequence_length = 128;
  auto windows = SampleWindows::Create(*dataset, options);
  ASSERT_TRUE(windows.ok()) << windows.status();
  // a: (1000 - 1) / 128 = 7 windows, 103 tokens unread; b: 256 / 128 = 2 windows, 0 unread.
  EXPECT_EQ(windows->num_samples(), 9);
  EXPECT_EQ(windows->unread_tokens(), 1000 - (7 * 128 + 1));
  EXPECT_EQ(windows->Window(0), (TokenRange{0, 129}));
  EXPECT_EQ(windows->Window(6), (TokenRange{768, 897}));
  EXPECT_EQ(windows->Window(7), (TokenRange{1000, 1129}));
  EXPECT_EQ(windows->Window(8), (TokenRange{1128, 1257}));

  std::vector<int64_t> inputs(128), targets(128);
  ASSERT_TRUE(windows->FetchSample(8, absl::MakeSpan(inputs), absl::MakeSpan(targets)).ok());
  EXPECT_EQ(inputs, std::vector<int64_t>(b.begin() + 128, b.begin() + 256));
  EXPECT_EQ(targets, std::vector<int64_t>(b.begin() + 129, b.begin() + 257));
  ASSERT_TRUE(windows->FetchSample(3, absl::MakeSpan(inputs), absl::MakeSpan(targets)).ok());
  EXPECT_EQ(inputs, std::vector<int64_t>(a.begin() + 384, a.begin() + 512));
  EXPECT_EQ(targets, std::vector<int64_t>(a.begin() + 385, a.begin() + 513));

  EXPECT_EQ(windows->FetchSample(9, absl::MakeSpan(inputs), absl::MakeSpan(targets)).code(),
            absl::StatusCode::kOutOfRange);
  std::vector<int64_t> small(127);
  EXPECT_EQ(windows->FetchSample(0, absl::MakeSpan(small), absl::MakeSpan(targets)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SampleWindowsTest, WindowsKeepTheirDataSetOpen) {
  TemporaryFolder folder;
  const std::vector<int64_t> tokens = TestTokens(1, 100, 5000);
  WriteBytes(folder.File("a.bin"), LlmcBytes(tokens));
  absl::StatusOr<SampleWindows> windows = absl::UnknownError("not built");
  {
    auto dataset = TokenDataset::Open(folder.path());
    ASSERT_TRUE(dataset.ok());
    const TokenDataset copy = *dataset;  // a handle: shares the mappings
    EXPECT_EQ(copy.identity(), dataset->identity());
    SampleWindowOptions options;
    options.sequence_length = 10;
    windows = SampleWindows::Create(*dataset, options);
    ASSERT_TRUE(windows.ok());
  }  // the caller's handles are gone; the windows' own keeps the files mapped
  std::vector<int64_t> inputs(10), targets(10);
  ASSERT_EQ(windows->num_samples(), 9);
  ASSERT_TRUE(windows->FetchSample(8, absl::MakeSpan(inputs), absl::MakeSpan(targets)).ok());
  EXPECT_EQ(inputs, std::vector<int64_t>(tokens.begin() + 80, tokens.begin() + 90));
  EXPECT_EQ(targets, std::vector<int64_t>(tokens.begin() + 81, tokens.begin() + 91));
}

TEST(SampleWindowsTest, AShardShorterThanOneSequenceIsRefusedNamingIt) {
  TemporaryFolder folder;
  WriteBytes(folder.File("a.bin"), LlmcBytes(TestTokens(1, 2000, 5000)));
  WriteBytes(folder.File("b.bin"), LlmcBytes(TestTokens(2, 1024, 5000)));
  auto dataset = TokenDataset::Open(folder.path());
  ASSERT_TRUE(dataset.ok());
  SampleWindowOptions options;
  options.sequence_length = 1024;
  auto windows = SampleWindows::Create(*dataset, options);
  ASSERT_FALSE(windows.ok());
  EXPECT_EQ(windows.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(windows.status().message(),
            absl::StrCat(folder.File("b.bin"),
                         ": the shard holds 1024 tokens, fewer than one "
                         "sample needs (sequence length 1024 + 1 = 1025)"));
  options.sequence_length = 1023;
  EXPECT_TRUE(SampleWindows::Create(*dataset, options).ok());
  options.sequence_length = 0;
  EXPECT_FALSE(SampleWindows::Create(*dataset, options).ok());
}

TEST(SampleWindowsTest, WindowsWithinDocumentsRespectMegatronDocuments) {
  TemporaryFolder folder;
  const std::vector<std::vector<int64_t>> documents = {
      TestTokens(1, 300, 5000), TestTokens(2, 50, 5000), TestTokens(3, 101, 5000),
      TestTokens(4, 0, 5000)};
  WriteMegatron(folder.File("m"), MegatronBytes(documents, 8, /*sequences_per_document=*/2));
  auto dataset = TokenDataset::Open(folder.File("m"));
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  SampleWindowOptions options;
  options.sequence_length = 100;
  options.layout = WindowLayout::kWithinDocuments;
  auto windows = SampleWindows::Create(*dataset, options);
  ASSERT_TRUE(windows.ok()) << windows.status();
  // Document 0: 2 windows (299 / 100), document 1: none, document 2: 1, document 3: none.
  ASSERT_EQ(windows->num_samples(), 3);
  EXPECT_EQ(windows->Window(1), (TokenRange{100, 201}));
  EXPECT_EQ(windows->Window(2), (TokenRange{350, 451}));
  EXPECT_EQ(windows->unread_tokens(), 99 + 50);  // document 0's tail, document 1
  std::vector<int64_t> inputs(100), targets(100);
  ASSERT_TRUE(windows->FetchSample(2, absl::MakeSpan(inputs), absl::MakeSpan(targets)).ok());
  EXPECT_EQ(inputs, std::vector<int64_t>(documents[2].begin(), documents[2].begin() + 100));
  EXPECT_EQ(targets, std::vector<int64_t>(documents[2].begin() + 1, documents[2].end()));

  options.sequence_length = 400;
  EXPECT_NE(SampleWindows::Create(*dataset, options)
                .status()
                .message()
                .find("no document of the data set holds one sample"),
            std::string::npos);

  WriteBytes(folder.File("l.bin"), LlmcBytes(TestTokens(1, 3000, 5000)));
  auto llmc = TokenDataset::Open(folder.File("l.bin"));
  ASSERT_TRUE(llmc.ok());
  options.sequence_length = 100;
  auto refused = SampleWindows::Create(*llmc, options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("need a document index"), std::string::npos);
}

TEST(SampleWindowsTest, FetchChecksTheVocabularyWhenAsked) {
  TemporaryFolder folder;
  std::vector<int64_t> tokens = TestTokens(1, 1000, 5000);
  tokens[500] = 6000;
  WriteBytes(folder.File("a.bin"), LlmcBytes(tokens));
  auto dataset = TokenDataset::Open(folder.path());
  ASSERT_TRUE(dataset.ok());
  SampleWindowOptions options;
  options.sequence_length = 100;
  options.vocabulary_size = 5000;
  auto windows = SampleWindows::Create(*dataset, options);
  ASSERT_TRUE(windows.ok());
  std::vector<int64_t> inputs(100), targets(100);
  EXPECT_TRUE(windows->FetchSample(3, absl::MakeSpan(inputs), absl::MakeSpan(targets)).ok());
  // Token 500 is the last target of window 4 ([400, 501)) and the first input of window 5.
  const absl::Status status =
      windows->FetchSample(4, absl::MakeSpan(inputs), absl::MakeSpan(targets));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("a.bin: token 500 of the file (global offset 500) is 6000"),
            std::string::npos)
      << status;
  EXPECT_FALSE(windows->FetchSample(5, absl::MakeSpan(inputs), absl::MakeSpan(targets)).ok());
}

}  // namespace
}  // namespace tandem::data
