// Token shards, mutated: every short truncation and many longer ones, random byte flips
// (biased to the headers and the Megatron index), hostile values in every header and index
// field, bytes appended. Each mutated file is opened and, when accepted, read whole, scanned
// for the vocabulary, cut into sample windows (both layouts) and every sample fetched. Nothing
// may crash or read outside the mapping (run under -DTANDEM_SANITIZE=address to check the
// latter); a refusal is a bad-input status (InvalidArgument, NotFound, OutOfRange, DataLoss)
// with a one-line message naming the file.
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "data/sample_windows.h"
#include "data/token_dataset.h"
#include "gtest/gtest.h"
#include "tests/tokens/token_files.h"

namespace tandem::data {
namespace {

using testing::TemporaryFolder;
using testing::TestTokens;

constexpr int kFlipCases = 300;
constexpr int kLongTruncations = 60;

bool IsBadInputCode(absl::StatusCode code) {
  return code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound ||
         code == absl::StatusCode::kOutOfRange || code == absl::StatusCode::kDataLoss;
}

// Everything a loader does with a data set. Returns the first refusal, if any; reading an
// accepted data set whole must succeed.
absl::Status Exercise(const std::string& path) {
  auto dataset = TokenDataset::Open(path);
  if (!dataset.ok()) return dataset.status();
  std::vector<int64_t> tokens(static_cast<size_t>(dataset->num_tokens()));
  const absl::Status read = dataset->ReadTokens(0, absl::MakeSpan(tokens));
  EXPECT_TRUE(read.ok()) << "an accepted data set must read whole: " << read;
  const absl::Status vocabulary = dataset->CheckVocabulary(50257);
  if (!vocabulary.ok()) return vocabulary;
  for (WindowLayout layout : {WindowLayout::kContiguous, WindowLayout::kWithinDocuments}) {
    SampleWindowOptions options;
    options.sequence_length = 16;
    options.layout = layout;
    auto windows = SampleWindows::Create(*dataset, options);
    if (!windows.ok()) {
      EXPECT_TRUE(IsBadInputCode(windows.status().code())) << windows.status();
      continue;
    }
    std::vector<int64_t> inputs(16), targets(16);
    for (int64_t sample = 0; sample < windows->num_samples(); ++sample) {
      const absl::Status fetched =
          windows->FetchSample(sample, absl::MakeSpan(inputs), absl::MakeSpan(targets));
      EXPECT_TRUE(fetched.ok()) << "sample " << sample << ": " << fetched;
      const TokenRange window = windows->Window(sample);
      if (window.begin < 0 || window.end > dataset->num_tokens()) {
        ADD_FAILURE() << "sample " << sample << " lies outside the data set";
        break;
      }
      EXPECT_EQ(inputs[0], tokens[window.begin]);
      EXPECT_EQ(targets[15], tokens[window.end - 1]);
    }
  }
  return absl::OkStatus();
}

struct Counts {
  int accepted = 0;
  int refused = 0;
};

// Writes `files` (name → bytes) into `folder`, exercises `path`, checks the outcome.
void Check(const TemporaryFolder& folder,
           const std::vector<std::pair<std::string, std::string>>& files, const std::string& path,
           const std::string& what, Counts* counts) {
  for (const auto& [name, bytes] : files) testing::WriteBytes(folder.File(name), bytes);
  absl::Status status;
  try {
    status = Exercise(path);
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": exception escaped: " << e.what();
    return;
  }
  if (status.ok()) {
    ++counts->accepted;
    return;
  }
  ++counts->refused;
  EXPECT_TRUE(IsBadInputCode(status.code())) << what << ": " << status;
  EXPECT_EQ(status.message().find('\n'), absl::string_view::npos) << what << ": " << status;
  EXPECT_NE(status.message().find(folder.path()), absl::string_view::npos)
      << what << ": the message names no file: " << status;
}

// Hostile values for a field of `width` bytes.
std::vector<std::string> HostileValues(int width, int64_t file_size) {
  const std::vector<uint64_t> values = {0,
                                        1,
                                        ~0ULL,
                                        0x7fffffffULL,
                                        0x80000000ULL,
                                        0xffffffffULL,
                                        1ULL << 62,
                                        0x8000000000000000ULL,
                                        static_cast<uint64_t>(file_size),
                                        static_cast<uint64_t>(file_size + 1),
                                        static_cast<uint64_t>(file_size / 2)};
  std::vector<std::string> encoded;
  for (uint64_t value : values) encoded.emplace_back(reinterpret_cast<const char*>(&value), width);
  return encoded;
}

// Fuzzes the file `name` of a valid set of `files`, opened through `path`. `fields` lists
// (offset, width) of the header or index fields of that file.
Counts Fuzz(const std::vector<std::pair<std::string, std::string>>& files, size_t target,
            const std::string& open_name, const std::vector<std::pair<int, int>>& fields,
            int header_bytes, uint32_t seed) {
  TemporaryFolder folder;
  const std::string path = folder.File(open_name);
  Counts counts;
  Counts valid;
  Check(folder, files, path, "unmutated", &valid);
  EXPECT_EQ(valid.accepted, 1) << "the unmutated files must be accepted";

  const std::string& original = files[target].second;
  const int64_t size = static_cast<int64_t>(original.size());
  auto with = [&](std::string bytes) {
    std::vector<std::pair<std::string, std::string>> mutated = files;
    mutated[target].second = std::move(bytes);
    return mutated;
  };
  std::mt19937 random(seed);  // which mutations run; their outcome must not depend on it
  auto pick = [&](int64_t bound) {
    return static_cast<int64_t>(random() % static_cast<uint32_t>(std::max<int64_t>(bound, 1)));
  };

  // Truncations: every length up to the header's end and a little beyond, then at random.
  for (int64_t length = 0; length < std::min<int64_t>(size, header_bytes + 40); ++length) {
    Check(folder, with(original.substr(0, length)), path, absl::StrCat("cut at ", length), &counts);
  }
  for (int i = 0; i < kLongTruncations; ++i) {
    const int64_t length = pick(size);
    Check(folder, with(original.substr(0, length)), path, absl::StrCat("cut at ", length), &counts);
  }
  // Bytes appended.
  for (int extra : {1, 2, 3, 8}) {
    Check(folder, with(original + std::string(extra, '\x7f')), path,
          absl::StrCat(extra, " bytes appended"), &counts);
  }
  // Hostile field values.
  for (const auto& [offset, width] : fields) {
    for (const std::string& value : HostileValues(width, size)) {
      std::string bytes = original;
      bytes.replace(offset, width, value);
      Check(folder, with(bytes), path, absl::StrCat("field at ", offset), &counts);
    }
  }
  // Byte flips, one to four, half of them in the header.
  for (int i = 0; i < kFlipCases; ++i) {
    std::string bytes = original;
    const int flips = 1 + static_cast<int>(pick(4));
    for (int f = 0; f < flips; ++f) {
      const int64_t at = pick(2) == 0 ? pick(std::min<int64_t>(size, header_bytes)) : pick(size);
      bytes[at] = static_cast<char>(bytes[at] ^ (1 + pick(255)));
    }
    Check(folder, with(bytes), path, absl::StrCat("flip case ", i), &counts);
  }
  return counts;
}

TEST(TokenFuzzTest, LlmcShardsNeverCrashTheReader) {
  for (int version : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("version ", version));
    const std::string bytes = testing::LlmcBytes(TestTokens(1, 300, 50257), version);
    const Counts counts = Fuzz({{"a.bin", bytes}}, 0, "a.bin", {{0, 4}, {4, 4}, {8, 4}},
                               /*header_bytes=*/1024, /*seed=*/version);
    EXPECT_GT(counts.refused, 100);
    EXPECT_GT(counts.accepted, 10);  // flips among the tokens, or in the unused header
  }
}

TEST(TokenFuzzTest, NanoGptShardsNeverCrashTheReader) {
  const std::string bytes = testing::NanoGptBytes(TestTokens(2, 301, 50257));
  const Counts counts = Fuzz({{"a.bin", bytes}}, 0, "a.bin", {{0, 4}, {4, 4}},
                             /*header_bytes=*/16, /*seed=*/3);
  EXPECT_GT(counts.refused, 10);  // odd sizes, a magic spelt by accident
  EXPECT_GT(counts.accepted, 100);
}

TEST(TokenFuzzTest, MegatronIndexesAndBinsNeverCrashTheReader) {
  const std::vector<std::vector<int64_t>> documents = {
      TestTokens(1, 40, 50257), TestTokens(2, 0, 50257), TestTokens(3, 75, 50257),
      TestTokens(4, 17, 50257)};
  for (int dtype_code : {8, 4}) {
    for (bool modes : {false, true}) {
      SCOPED_TRACE(absl::StrCat("dtype ", dtype_code, ", modes ", modes));
      const testing::MegatronFileBytes files =
          testing::MegatronBytes(documents, dtype_code, /*sequences_per_document=*/2, modes);
      // 8 sequences, 5 document indices: lengths at 34, pointers at 66, documents at 130.
      std::vector<std::pair<int, int>> fields = {{9, 8}, {17, 1}, {18, 8}, {26, 8}};
      for (int s = 0; s < 8; ++s) {
        fields.push_back({34 + 4 * s, 4});
        fields.push_back({66 + 8 * s, 8});
      }
      for (int d = 0; d < 5; ++d) fields.push_back({130 + 8 * d, 8});
      const int index_bytes = static_cast<int>(files.idx.size());
      const Counts index = Fuzz({{"m.bin", files.bin}, {"m.idx", files.idx}}, 1, "m", fields,
                                index_bytes, /*seed=*/dtype_code + modes);
      EXPECT_GT(index.refused, 200);
      const Counts bin = Fuzz({{"m.bin", files.bin}, {"m.idx", files.idx}}, 0, "m.bin", {},
                              /*header_bytes=*/0, /*seed=*/dtype_code + modes + 10);
      EXPECT_GT(bin.refused, 20);    // any length change
      EXPECT_GT(bin.accepted, 100);  // flips among the tokens
    }
  }
}

}  // namespace
}  // namespace tandem::data
