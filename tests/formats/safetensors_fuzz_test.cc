// Valid safetensors files, mutated: truncations, random byte flips, header-size rewrites, and
// headers rewritten (with a correct size field, so the checks behind the JSON parser are
// reached) to hold lying offsets, hostile shapes, other dtypes, repeated keys and other
// shapes of JSON. Every result is either an error status (a bad-input code, a one-line message
// naming the source) or a file whose every tensor reads within its bounds: never a crash.
// Images are checked from exactly-sized heap buffers, so that under -fsanitize=address a read
// one byte past the end is reported; a share also goes through real files and mmap.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "formats/safetensors.h"
#include "gtest/gtest.h"

namespace tandem::formats {
namespace {

constexpr int kCasesPerKind = 2000;

template <typename T>
std::string BytesOf(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

absl::Span<const uint8_t> SpanOf(const std::string& bytes) {
  return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

std::string LittleEndian64(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(value >> (8 * i));
  return out;
}

// The seed: several dtypes, a scalar, an empty tensor, metadata.
const std::string& SeedImage() {
  static const std::string image = [] {
    std::vector<float> matrix(24);
    for (size_t i = 0; i < matrix.size(); ++i) matrix[i] = static_cast<float>(i) - 3.5f;
    static const std::string matrix_bytes = BytesOf(matrix);
    static const std::string brain = BytesOf(std::vector<uint16_t>{0x3f80, 0xc000, 0x7f80, 0x0001, 0x7fc0, 0x8000});
    static const std::string half = BytesOf(std::vector<uint16_t>{0x3c00, 0x7bff, 0x0001});
    static const std::string scalar = BytesOf(std::vector<double>{2.5});
    static const std::string step = BytesOf(std::vector<int64_t>{9, -9});
    std::vector<TensorToWrite> tensors = {
        {"layers.0.weight", DataType::kFloat32, {4, 6}, SpanOf(matrix_bytes), nullptr},
        {"layers.0.norm", DataType::kBfloat16, {2, 3}, SpanOf(brain), nullptr},
        {"layers.0.bias", DataType::kFloat16, {3}, SpanOf(half), nullptr},
        {"scale", DataType::kFloat64, {}, SpanOf(scalar), nullptr},
        {"step", DataType::kInt64, {2}, SpanOf(step), nullptr},
        {"empty", DataType::kFloat32, {0, 3}, {}, nullptr},
    };
    auto serialized = SerializeSafetensors(tensors, {{"format", "pt"}});
    EXPECT_TRUE(serialized.ok()) << serialized.status();
    return serialized.ok() ? *serialized : std::string();
  }();
  return image;
}

// The JSON text of the seed's header (without its padding).
std::string SeedHeader() {
  const std::string& image = SeedImage();
  uint64_t size = 0;
  for (int i = 7; i >= 0; --i) size = (size << 8) | static_cast<uint8_t>(image[static_cast<size_t>(i)]);
  return image.substr(8, size);
}

std::string SeedData() {
  const std::string& image = SeedImage();
  return image.substr(8 + SeedHeader().size());
}

const std::vector<std::string>& HostileNumbers() {
  static const std::vector<std::string> values = {
      "-1", "0", "1", "7", "8", "12", "1e400", "-1e400", "2.5", "1e18",
      "9223372036854775807", "9223372036854775808", "18446744073709551615",
      "18446744073709551616", "-9223372036854775808", "4294967296", "\"x\"", "null", "[]", "{}",
      "true", "[0,0]", "4611686018427387904"};
  return values;
}

// Positions of the numbers in `text` (start, length).
std::vector<std::pair<size_t, size_t>> NumberSpans(const std::string& text) {
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t i = 0; i < text.size();) {
    const bool digit = text[i] >= '0' && text[i] <= '9';
    if (!digit || (i > 0 && (std::isalnum(static_cast<unsigned char>(text[i - 1])) ||
                             text[i - 1] == '_' || text[i - 1] == '.'))) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
    spans.emplace_back(i, j - i);
    i = j;
  }
  return spans;
}

// Mutation `index` of kind `kind` of the seed image, deterministic.
std::string Mutate(int kind, int index) {
  const std::string& image = SeedImage();
  const std::string header = SeedHeader();
  const std::string data = SeedData();
  std::mt19937_64 rng(static_cast<uint64_t>(kind) * 1000003 + static_cast<uint64_t>(index));
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % std::max<size_t>(n, 1)); };
  auto with_header = [&](const std::string& text, const std::string& body) {
    return LittleEndian64(text.size()) + text + body;
  };
  switch (kind) {
    case 0:  // truncated anywhere
      return image.substr(0, pick(image.size() + 1));
    case 1: {  // a few random bytes changed, mostly in the header
      std::string out = image;
      const size_t flips = 1 + pick(4);
      for (size_t k = 0; k < flips; ++k) {
        const size_t at = pick(4) == 0 ? pick(out.size()) : pick(8 + header.size());
        out[at] = static_cast<char>(rng() & 0xff);
      }
      return out;
    }
    case 2: {  // the header size field rewritten
      const uint64_t values[] = {0,
                                 1,
                                 header.size() - 1,
                                 header.size() + 1,
                                 header.size() + data.size(),
                                 header.size() + data.size() + 1,
                                 100'000'000,
                                 100'000'001,
                                 ~uint64_t{0},
                                 uint64_t{1} << 63,
                                 rng()};
      return LittleEndian64(values[pick(sizeof(values) / sizeof(values[0]))]) + image.substr(8);
    }
    case 3: {  // one number of the header (an offset or a dimension) replaced; size kept right
      const auto spans = NumberSpans(header);
      const auto [at, length] = spans[pick(spans.size())];
      std::string value = HostileNumbers()[pick(HostileNumbers().size())];
      if (pick(3) == 0) {  // near the true value: the lies that a careless reader accepts
        const long long original = std::stoll(header.substr(at, length));
        value = std::to_string(original + static_cast<long long>(pick(5)) - 2);
      }
      std::string text = header.substr(0, at) + value + header.substr(at + length);
      return with_header(text, data);
    }
    case 4: {  // structural rewrites of the header document
      Json document = Json::parse(header);
      std::vector<std::string> names;
      for (auto it = document.begin(); it != document.end(); ++it) {
        if (it.key() != "__metadata__") names.push_back(it.key());
      }
      const std::string name = names[pick(names.size())];
      const std::string other = names[pick(names.size())];
      std::string body = data;
      switch (pick(12)) {
        case 0:
          document[name]["dtype"] = std::vector<std::string>{
              "F32", "F16", "BF16", "F64", "I64", "U8", "BOOL", "F4", "F6_E2M3", "C64",
              "F8_E4M3", "X", ""}[pick(13)];
          break;
        case 1:
          document[name]["data_offsets"] = document[other]["data_offsets"];
          break;
        case 2:
          document[name]["shape"] = document[other]["shape"];
          break;
        case 3:
          document[name].erase(std::vector<std::string>{"dtype", "shape", "data_offsets"}[pick(3)]);
          break;
        case 4:
          document.erase(name);
          break;
        case 5:
          document[name]["shape"].push_back(pick(3));
          break;
        case 6:
          document[name] = std::vector<Json>{Json(), Json(1), Json("x"), Json::array()}[pick(4)];
          break;
        case 7:
          document["__metadata__"] =
              std::vector<Json>{Json(), Json(1), Json::array(), Json{{"k", 1}}, Json{{"k", "v"}}}[pick(5)];
          break;
        case 8: {  // a key repeated, textually
          std::string text = document.dump();
          const std::string entry = Json(name).dump() + ":" + document[name].dump();
          text.insert(1, entry + ",");
          return with_header(text, body);
        }
        case 9: {  // deep nesting inside an extra field
          std::string text = document.dump();
          const size_t depth = 200 + pick(200);
          const std::string deep = "\"deep\":" + std::string(depth, '[') + std::string(depth, ']') + ",";
          text.insert(text.find('{', 1) + 1, deep);
          return with_header(text, body);
        }
        case 10:
          body.append(pick(9), '\0');
          if (!body.empty() && pick(2) == 0) body.resize(body.size() - 1 - pick(body.size() - 1));
          break;
        default:  // another shape of document
          return with_header(std::vector<std::string>{"[]", "null", "7", "\"x\"", "", " ", "{}",
                                                      "{\"a\":{}}"}[pick(8)],
                             body);
      }
      std::string text = document.dump();
      text.append(pick(9), ' ');
      return with_header(text, body);
    }
    default:  // two mutations stacked: a header rewrite, then a byte flip
    {
      std::string out = Mutate(3, index);
      if (!out.empty()) out[pick(out.size())] = static_cast<char>(rng() & 0xff);
      return out;
    }
  }
}

bool IsBadInputCode(absl::StatusCode code) {
  return code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound ||
         code == absl::StatusCode::kOutOfRange || code == absl::StatusCode::kDataLoss ||
         code == absl::StatusCode::kResourceExhausted;
}

// Reads every tensor of an accepted file every way; checks the description is self-consistent.
void ReadEverything(const SafetensorsFile& file, const std::string& what) {
  int64_t covered = 0;
  for (const std::string& name : file.TensorNamesInFileOrder()) {
    auto info = file.Info(name);
    ASSERT_TRUE(info.ok()) << what << ": " << info.status();
    const TensorInfo& t = **info;
    EXPECT_EQ(t.byte_offset, covered) << what << " " << name;
    covered = t.byte_offset + t.byte_size;
    EXPECT_LE(covered, file.data_bytes()) << what << " " << name;
    auto bytes = file.Bytes(name);
    ASSERT_TRUE(bytes.ok()) << what;
    ASSERT_EQ(static_cast<int64_t>(bytes->size()), t.byte_size) << what;
    volatile uint8_t sum = 0;
    for (uint8_t b : *bytes) sum = static_cast<uint8_t>(sum + b);
    if (ConvertsToFloat32(t.data_type)) {
      std::vector<float> out(static_cast<size_t>(t.element_count));
      EXPECT_TRUE(file.ReadAsFloat32(name, out.data(), t.element_count).ok()) << what;
    }
    if (!t.shape.empty() && t.shape[0] > 0 && DataTypeBits(t.data_type) % 8 == 0) {
      const TensorSlice slice{0, t.shape[0] / 2, t.shape[0]};
      auto shape = SliceShape(t.shape, slice, name);
      ASSERT_TRUE(shape.ok()) << what;
      int64_t count = t.element_count == 0 ? 0 : 1;
      for (int64_t d : *shape) count *= d;
      std::vector<uint8_t> raw(static_cast<size_t>(count * DataTypeBits(t.data_type) / 8));
      EXPECT_TRUE(file.ReadSliceBytes(name, slice, raw.data(), static_cast<int64_t>(raw.size())).ok())
          << what << " " << name;
    }
  }
  EXPECT_EQ(covered, file.data_bytes()) << what;
}

void CheckRejection(const absl::Status& status, const std::string& source, const std::string& what) {
  EXPECT_TRUE(IsBadInputCode(status.code())) << what << ": " << status;
  EXPECT_EQ(status.message().rfind(source, 0), 0u) << what << ": " << status;
  EXPECT_EQ(status.message().find('\n'), absl::string_view::npos) << what << ": " << status;
}

TEST(SafetensorsFuzzTest, MutatedImagesAreRejectedOrReadSafely) {
  ASSERT_FALSE(SeedImage().empty());
  {
    auto seed = SafetensorsFile::FromBytes(SpanOf(SeedImage()), "seed");
    ASSERT_TRUE(seed.ok()) << seed.status();
    ReadEverything(**seed, "seed");
  }
  const char* kKinds[] = {"truncation", "byte flips", "header size", "header number",
                          "header structure", "stacked"};
  for (int kind = 0; kind < 6; ++kind) {
    int accepted = 0;
    for (int i = 0; i < kCasesPerKind; ++i) {
      const std::string input = Mutate(kind, i);
      // An exactly-sized heap copy: a read past its end is a sanitizer report.
      std::vector<uint8_t> buffer(input.begin(), input.end());
      const std::string what = absl::StrCat(kKinds[kind], " case ", i);
      auto file = SafetensorsFile::FromBytes(buffer, "fuzzed");
      if (file.ok()) {
        ++accepted;
        ReadEverything(**file, what);
      } else {
        CheckRejection(file.status(), "fuzzed", what);
      }
    }
    // Each kind must reject some (else the mutations test nothing).
    EXPECT_LT(accepted, kCasesPerKind) << kKinds[kind];
    std::printf("%-16s %4d of %d mutations accepted and read whole\n", kKinds[kind], accepted,
                kCasesPerKind);
  }
}

TEST(SafetensorsFuzzTest, MutatedFilesThroughMmap) {
  std::string folder = ::testing::TempDir() + "/safetensors_fuzz.XXXXXX";
  ASSERT_NE(::mkdtemp(folder.data()), nullptr);
  const std::string path = folder + "/fuzzed.safetensors";
  for (int kind = 0; kind < 6; ++kind) {
    for (int i = 0; i < 40; ++i) {
      const std::string input = Mutate(kind, i);
      ASSERT_TRUE(WriteFileAtomically(path, input).ok());
      const std::string what = absl::StrCat("file kind ", kind, " case ", i);
      auto file = SafetensorsFile::Open(path);
      if (file.ok()) {
        ReadEverything(**file, what);
      } else {
        CheckRejection(file.status(), path, what);
      }
    }
  }
}

}  // namespace
}  // namespace tandem::formats
