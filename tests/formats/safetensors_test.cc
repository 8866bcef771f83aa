// safetensors files and Hugging Face folders: the reference writer's byte layout, write/read
// round trips, each validation rule (the error names the file and the key), slices, 16-bit
// float conversions, sharded folders with their index and its error cases, and files exchanged
// with the reference Python package both ways (skipped, with the reason, when it is absent).
#include "formats/safetensors.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "gtest/gtest.h"

namespace tandem::formats {
namespace {

// ---- Helpers ---------------------------------------------------------------------------------

std::string LittleEndian64(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(value >> (8 * i));
  return out;
}

// A file image: size field, header text as given, data.
std::string Image(const std::string& header, const std::string& data) {
  return LittleEndian64(header.size()) + header + data;
}

template <typename T>
std::string BytesOf(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

absl::Span<const uint8_t> SpanOf(const std::string& bytes) {
  return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

std::string StringOf(absl::Span<const uint8_t> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// A tensor with its bytes, for TensorToWrite's spans to point into.
struct OwnedTensor {
  std::string name;
  DataType data_type;
  std::vector<int64_t> shape;
  std::string bytes;
};

std::vector<TensorToWrite> ToWrite(const std::vector<OwnedTensor>& tensors) {
  std::vector<TensorToWrite> out;
  for (const OwnedTensor& t : tensors) {
    TensorToWrite w;
    w.name = t.name;
    w.data_type = t.data_type;
    w.shape = t.shape;
    w.bytes = SpanOf(t.bytes);
    out.push_back(std::move(w));
  }
  return out;
}

std::string MakeTempFolder() {
  std::string pattern = ::testing::TempDir() + "/safetensors_test.XXXXXX";
  const char* made = ::mkdtemp(pattern.data());
  EXPECT_NE(made, nullptr) << std::strerror(errno);
  return pattern;
}

std::string ReadWhole(const std::string& path) {
  auto text = ReadFile(path);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

bool Exists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

std::vector<std::string> FolderEntries(const std::string& folder) {
  std::vector<std::string> names;
  FILE* pipe = ::popen(absl::StrCat("ls -1 '", folder, "'").c_str(), "r");
  char line[4096];
  while (pipe != nullptr && std::fgets(line, sizeof(line), pipe) != nullptr) {
    std::string name = line;
    if (!name.empty() && name.back() == '\n') name.pop_back();
    names.push_back(name);
  }
  if (pipe != nullptr) ::pclose(pipe);
  return names;
}

std::vector<float> ReadFloats(const SafetensorsFile& file, const std::string& name) {
  auto info = file.Info(name);
  EXPECT_TRUE(info.ok()) << info.status();
  if (!info.ok()) return {};
  std::vector<float> out(static_cast<size_t>((*info)->element_count));
  const absl::Status read = file.ReadAsFloat32(name, out.data(), (*info)->element_count);
  EXPECT_TRUE(read.ok()) << read;
  return out;
}

// A mix of every common dtype, a scalar and an empty tensor.
std::vector<OwnedTensor> MixedTensors() {
  std::vector<float> matrix(12);
  for (size_t i = 0; i < matrix.size(); ++i) matrix[i] = static_cast<float>(i) * 0.5f - 2.0f;
  return {
      {"layers.0.attention.weight", DataType::kFloat32, {3, 4}, BytesOf(matrix)},
      {"layers.0.norm.weight", DataType::kBfloat16, {3},
       BytesOf(std::vector<uint16_t>{0x3f80, 0xc000, 0x7f80})},
      {"layers.0.norm.bias", DataType::kFloat16, {2}, BytesOf(std::vector<uint16_t>{0x3c00, 0x0001})},
      {"scale", DataType::kFloat64, {}, BytesOf(std::vector<double>{0.1})},
      {"step", DataType::kInt64, {1}, BytesOf(std::vector<int64_t>{42})},
      {"mask", DataType::kBool, {2, 2}, std::string("\x01\x00\x00\x01", 4)},
      {"empty", DataType::kFloat32, {0, 7}, ""},
      {"packed", DataType::kFloat4, {4}, std::string("\x12\x34", 2)},
      {"counts", DataType::kUint32, {2}, BytesOf(std::vector<uint32_t>{7, 0xffffffffu})},
  };
}

// ---- Data types and conversions --------------------------------------------------------------

TEST(DataTypeTest, NamesRoundTripAndSizes) {
  for (int i = 0; i <= static_cast<int>(DataType::kUint64); ++i) {
    const DataType type = static_cast<DataType>(i);
    auto parsed = ParseDataType(DataTypeName(type));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, type);
  }
  EXPECT_EQ(DataTypeBits(DataType::kBfloat16), 16);
  EXPECT_EQ(DataTypeBits(DataType::kFloat4), 4);
  EXPECT_EQ(DataTypeBits(DataType::kFloat6E3M2), 6);
  EXPECT_EQ(DataTypeBits(DataType::kComplex64), 64);
  EXPECT_EQ(DataTypeName(DataType::kFloat8E4M3Fnuz), "F8_E4M3FNUZ");
  EXPECT_FALSE(ParseDataType("f32").ok());
  EXPECT_FALSE(ParseDataType("").ok());
  EXPECT_EQ(*TensorByteSize(DataType::kFloat4, {6}, "x"), 3);
  EXPECT_FALSE(TensorByteSize(DataType::kFloat4, {3}, "x").ok());  // 12 bits
  EXPECT_FALSE(TensorByteSize(DataType::kFloat32, {-1}, "x").ok());
  EXPECT_FALSE(TensorByteSize(DataType::kFloat64, {int64_t{1} << 31, int64_t{1} << 31}, "x").ok());
}

TEST(ConversionTest, Bfloat16KnownBitPatterns) {
  EXPECT_EQ(Bfloat16BitsToFloat32(0x3f80), 1.0f);
  EXPECT_EQ(Bfloat16BitsToFloat32(0xc000), -2.0f);
  EXPECT_EQ(Bfloat16BitsToFloat32(0x4049), 3.140625f);
  EXPECT_EQ(Bfloat16BitsToFloat32(0x0001), std::ldexp(1.0f, -133));  // smallest subnormal
  EXPECT_EQ(Bfloat16BitsToFloat32(0x7f7f), std::ldexp(255.0f, 120));  // largest finite
  EXPECT_TRUE(std::signbit(Bfloat16BitsToFloat32(0x8000)));
  EXPECT_EQ(Bfloat16BitsToFloat32(0x8000), 0.0f);
  EXPECT_EQ(Bfloat16BitsToFloat32(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(Bfloat16BitsToFloat32(0xff80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(Bfloat16BitsToFloat32(0x7fc0)));
}

TEST(ConversionTest, Float16KnownBitPatterns) {
  EXPECT_EQ(Float16BitsToFloat32(0x3c00), 1.0f);
  EXPECT_EQ(Float16BitsToFloat32(0xc000), -2.0f);
  EXPECT_EQ(Float16BitsToFloat32(0x7bff), 65504.0f);
  EXPECT_EQ(Float16BitsToFloat32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(Float16BitsToFloat32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(Float16BitsToFloat32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(Float16BitsToFloat32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(Float16BitsToFloat32(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::signbit(Float16BitsToFloat32(0x8000)));
  EXPECT_EQ(Float16BitsToFloat32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(Float16BitsToFloat32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(Float16BitsToFloat32(0x7e00)));
  EXPECT_TRUE(std::isnan(Float16BitsToFloat32(0x7c01)));  // signalling NaN stays NaN
}

TEST(ConversionTest, Float32ToSixteenBitsRoundsToNearestEven) {
  const float one_ulp_bf16 = std::ldexp(1.0f, -7);
  EXPECT_EQ(Float32ToBfloat16Bits(1.0f), 0x3f80);
  EXPECT_EQ(Float32ToBfloat16Bits(1.0f + one_ulp_bf16 / 2), 0x3f80);      // tie, to even
  EXPECT_EQ(Float32ToBfloat16Bits(1.0f + 3 * one_ulp_bf16 / 2), 0x3f82);  // tie, to even
  EXPECT_EQ(Float32ToBfloat16Bits(1.0f + one_ulp_bf16 * 0.51f), 0x3f81);
  EXPECT_EQ(Float32ToBfloat16Bits(std::numeric_limits<float>::max()), 0x7f80);  // to infinity
  EXPECT_EQ(Float32ToBfloat16Bits(-0.0f), 0x8000);
  const uint16_t nan = Float32ToBfloat16Bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(Bfloat16BitsToFloat32(nan)));
  // A signalling NaN whose payload lies only in the dropped bits must not become infinity.
  uint32_t signalling_bits = 0x7f800001;
  float signalling;
  std::memcpy(&signalling, &signalling_bits, 4);
  EXPECT_TRUE(std::isnan(Bfloat16BitsToFloat32(Float32ToBfloat16Bits(signalling))));

  EXPECT_EQ(Float32ToFloat16Bits(1.0f), 0x3c00);
  EXPECT_EQ(Float32ToFloat16Bits(-2.0f), 0xc000);
  EXPECT_EQ(Float32ToFloat16Bits(1.0f / 3.0f), 0x3555);
  EXPECT_EQ(Float32ToFloat16Bits(65504.0f), 0x7bff);
  EXPECT_EQ(Float32ToFloat16Bits(65519.0f), 0x7bff);
  EXPECT_EQ(Float32ToFloat16Bits(65520.0f), 0x7c00);  // halfway to 65536: to even = infinity
  EXPECT_EQ(Float32ToFloat16Bits(1e10f), 0x7c00);
  EXPECT_EQ(Float32ToFloat16Bits(-1e10f), 0xfc00);
  EXPECT_EQ(Float32ToFloat16Bits(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 1 unit
  EXPECT_EQ(Float32ToFloat16Bits(std::ldexp(1.0f, -25) * 1.0000001f), 0x0001);
  EXPECT_EQ(Float32ToFloat16Bits(std::ldexp(1.5f, -24)), 0x0002);  // tie, to even
  EXPECT_EQ(Float32ToFloat16Bits(std::ldexp(2.5f, -24)), 0x0002);  // tie, to even
  EXPECT_EQ(Float32ToFloat16Bits(std::ldexp(1023.5f, -24)), 0x0400);  // rounds to a normal
  EXPECT_EQ(Float32ToFloat16Bits(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(Float32ToFloat16Bits(-std::ldexp(1.0f, -30)), 0x8000);
  EXPECT_EQ(Float32ToFloat16Bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, to even
  EXPECT_EQ(Float32ToFloat16Bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, to even
  EXPECT_TRUE(std::isnan(Float16BitsToFloat32(
      Float32ToFloat16Bits(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(Float16BitsToFloat32(Float32ToFloat16Bits(signalling))));
}

TEST(ConversionTest, EverySixteenBitValueRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t b = static_cast<uint16_t>(bits);
    const float half = Float16BitsToFloat32(b);
    if (std::isnan(half)) {
      EXPECT_TRUE(std::isnan(Float16BitsToFloat32(Float32ToFloat16Bits(half)))) << bits;
    } else {
      EXPECT_EQ(Float32ToFloat16Bits(half), b) << bits;
    }
    const float brain = Bfloat16BitsToFloat32(b);
    if (std::isnan(brain)) {
      EXPECT_TRUE(std::isnan(Bfloat16BitsToFloat32(Float32ToBfloat16Bits(brain)))) << bits;
    } else {
      EXPECT_EQ(Float32ToBfloat16Bits(brain), b) << bits;
    }
  }
}

// ---- Writer ----------------------------------------------------------------------------------

TEST(WriterTest, MatchesTheReferenceLayout) {
  // The reference's own serialization examples: one F32 tensor, and no tensor at all.
  const std::string data = BytesOf(std::vector<float>{0, 1, 2, 3, 4, 5});
  auto image = SerializeSafetensors(ToWrite({{"attn.0", DataType::kFloat32, {1, 2, 3}, data}}));
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(*image, Image(R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})",
                          data));
  // A header of 61 bytes is padded with spaces to 64, so the data starts aligned.
  image = SerializeSafetensors(ToWrite({{"attn0", DataType::kFloat32, {1, 1, 2, 3}, data}}));
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(*image,
            Image(R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}}       )",
                  data));
  EXPECT_EQ(*SerializeSafetensors({}), Image("{}      ", ""));
  EXPECT_EQ(*SerializeSafetensors({}, {{"framework", "pt"}}),
            Image(R"({"__metadata__":{"framework":"pt"}}     )", ""));

  // Descending alignment, then name; metadata first with sorted keys.
  image = SerializeSafetensors(ToWrite(MixedTensors()), {{"z", "1"}, {"format", "pt"}});
  ASSERT_TRUE(image.ok()) << image.status();
  auto file = SafetensorsFile::FromBytes(SpanOf(*image), "mixed");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->TensorNamesInFileOrder(),
            (std::vector<std::string>{"step", "scale", "empty", "layers.0.attention.weight",
                                      "counts", "layers.0.norm.weight", "layers.0.norm.bias",
                                      "packed", "mask"}));
  EXPECT_EQ((*file)->header_bytes() % 8, 0);
  EXPECT_TRUE(absl::StartsWith(image->substr(8), R"({"__metadata__":{"format":"pt","z":"1"},)"));
}

TEST(WriterTest, RoundTripIsBitIdentical) {
  const std::string folder = MakeTempFolder();
  const std::string path = folder + "/mixed.safetensors";
  const std::vector<OwnedTensor> tensors = MixedTensors();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "é ü \n"}};
  ASSERT_TRUE(WriteSafetensorsFile(path, ToWrite(tensors), metadata).ok());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->Metadata(), metadata);
  std::vector<std::string> sorted;
  for (const OwnedTensor& t : tensors) sorted.push_back(t.name);
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ((*file)->TensorNamesSorted(), sorted);
  for (const OwnedTensor& t : tensors) {
    auto info = (*file)->Info(t.name);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ((*info)->data_type, t.data_type) << t.name;
    EXPECT_EQ((*info)->shape, t.shape) << t.name;
    EXPECT_EQ((*info)->byte_size, static_cast<int64_t>(t.bytes.size())) << t.name;
    EXPECT_EQ(StringOf(*(*file)->Bytes(t.name)), t.bytes) << t.name;
  }
  EXPECT_EQ((*(*file)->Info("scale"))->element_count, 1);
  EXPECT_EQ((*(*file)->Info("empty"))->element_count, 0);

  // What was read, written again, is the same file byte for byte.
  std::vector<TensorToWrite> again;
  for (const std::string& name : (*file)->TensorNamesInFileOrder()) {
    const TensorInfo& info = **(*file)->Info(name);
    again.push_back({name, info.data_type, info.shape, *(*file)->Bytes(name), nullptr});
  }
  const std::string copy = folder + "/copy.safetensors";
  ASSERT_TRUE(WriteSafetensorsFile(copy, again, (*file)->Metadata()).ok());
  EXPECT_EQ(ReadWhole(copy), ReadWhole(path));
  EXPECT_EQ(FolderEntries(folder), (std::vector<std::string>{"copy.safetensors",
                                                            "mixed.safetensors"}));
}

TEST(WriterTest, RefusesBadTensorsAndLeavesNoFile) {
  const std::string folder = MakeTempFolder();
  const std::string path = folder + "/bad.safetensors";
  const std::string four = BytesOf(std::vector<float>{1});
  struct Case {
    std::vector<OwnedTensor> tensors;
    std::map<std::string, std::string> metadata;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{{"w", DataType::kFloat32, {2}, four}}, {}, "takes 8 bytes but 4 were given"},
      {{{"w", DataType::kFloat32, {-1}, four}}, {}, "negative"},
      {{{"w", DataType::kFloat32, {1}, four}, {"w", DataType::kFloat32, {1}, four}}, {},
       "given twice"},
      {{{"", DataType::kFloat32, {1}, four}}, {}, "empty name"},
      {{{"__metadata__", DataType::kFloat32, {1}, four}}, {}, "__metadata__"},
      {{{"bad\xff", DataType::kFloat32, {1}, four}}, {}, "UTF-8"},
      {{{"w", DataType::kFloat32, {1}, four}}, {{"k", "\xc0\x80"}}, "UTF-8"},
      {{{"w", DataType::kFloat4, {3}, std::string(2, '\0')}}, {}, "not a whole number"},
  };
  for (const Case& c : cases) {
    const absl::Status status = WriteSafetensorsFile(path, ToWrite(c.tensors), c.metadata);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), c.expected)) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), path)) << status;
  }
  EXPECT_TRUE(FolderEntries(folder).empty());
  EXPECT_EQ(WriteSafetensorsFile(folder + "/missing/x.safetensors", {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafetensorsFile(folder, {}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(WriterTest, FailedFillKeepsTheOldFileAndLeavesNoTemporary) {
  const std::string folder = MakeTempFolder();
  const std::string path = folder + "/model.safetensors";
  ASSERT_TRUE(WriteSafetensorsFile(path, ToWrite(MixedTensors())).ok());
  const std::string before = ReadWhole(path);

  std::vector<TensorToWrite> tensors(2);
  tensors[0] = {"a", DataType::kFloat32, {1024}, {}, [](absl::Span<uint8_t> destination) {
                  std::memset(destination.data(), 1, destination.size());
                  return absl::OkStatus();
                }};
  tensors[1] = {"b", DataType::kFloat32, {4}, {}, [](absl::Span<uint8_t>) {
                  return absl::UnavailableError("device copy failed");
                }};
  const absl::Status status = WriteSafetensorsFile(path, tensors);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "'b'")) << status;
  EXPECT_EQ(ReadWhole(path), before);
  EXPECT_EQ(FolderEntries(folder), std::vector<std::string>{"model.safetensors"});

  // The same callbacks, succeeding, write what they produce.
  tensors[1].fill_bytes = [](absl::Span<uint8_t> destination) {
    std::memset(destination.data(), 2, destination.size());
    return absl::OkStatus();
  };
  ASSERT_TRUE(WriteSafetensorsFile(path, tensors).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(StringOf(*(*file)->Bytes("a")), std::string(4096, '\x01'));
  EXPECT_EQ(StringOf(*(*file)->Bytes("b")), std::string(16, '\x02'));
}

// ---- Reader ----------------------------------------------------------------------------------

TEST(ReaderTest, ReadAsFloat32ConvertsEachFloatType) {
  auto image = SerializeSafetensors(ToWrite(MixedTensors()));
  ASSERT_TRUE(image.ok());
  auto file = SafetensorsFile::FromBytes(SpanOf(*image), "mixed");
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsFile& f = **file;
  EXPECT_EQ(ReadFloats(f, "layers.0.attention.weight"),
            (std::vector<float>{-2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5}));
  EXPECT_EQ(ReadFloats(f, "layers.0.norm.weight"),
            (std::vector<float>{1, -2, std::numeric_limits<float>::infinity()}));
  EXPECT_EQ(ReadFloats(f, "layers.0.norm.bias"), (std::vector<float>{1, std::ldexp(1.0f, -24)}));
  EXPECT_EQ(ReadFloats(f, "scale"), std::vector<float>{0.1f});
  EXPECT_TRUE(ReadFloats(f, "empty").empty());

  float out[4];
  absl::Status status = f.ReadAsFloat32("step", out, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "I64")) << status;
  status = f.ReadAsFloat32("layers.0.norm.weight", out, 4);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "'layers.0.norm.weight'")) << status;
  status = f.ReadAsFloat32("nope", out, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(status.message(), "mixed: no tensor 'nope'")) << status;
}

TEST(ReaderTest, SlicesRowsColumnsAndInnerDimensions) {
  std::vector<float> values(24);
  std::vector<uint16_t> brain(24);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<float>(i);
    brain[i] = Float32ToBfloat16Bits(values[i]);
  }
  auto image = SerializeSafetensors(ToWrite({{"m", DataType::kFloat32, {4, 6}, BytesOf(values)},
                                             {"b", DataType::kBfloat16, {4, 6}, BytesOf(brain)},
                                             {"c", DataType::kFloat32, {2, 3, 4}, BytesOf(values)},
                                             {"z", DataType::kFloat32, {0, 3}, ""},
                                             {"s", DataType::kFloat32, {}, BytesOf(values).substr(0, 4)}}));
  ASSERT_TRUE(image.ok());
  auto opened = SafetensorsFile::FromBytes(SpanOf(*image), "slices");
  ASSERT_TRUE(opened.ok()) << opened.status();
  const SafetensorsFile& file = **opened;

  auto slice = [&](const std::string& name, TensorSlice s) {
    auto info = file.Info(name);
    auto shape = SliceShape((*info)->shape, s, name);
    EXPECT_TRUE(shape.ok()) << shape.status();
    int64_t count = 1;
    for (int64_t d : *shape) count *= d;
    std::vector<float> out(static_cast<size_t>(count), -1);
    const absl::Status status = file.ReadSliceAsFloat32(name, s, out.data(), count);
    EXPECT_TRUE(status.ok()) << status;
    return out;
  };
  // Rows [1, 3) of a 4x6 matrix.
  std::vector<float> expected;
  for (int i = 6; i < 18; ++i) expected.push_back(static_cast<float>(i));
  EXPECT_EQ(slice("m", {0, 1, 3}), expected);
  EXPECT_EQ(slice("b", {0, 1, 3}), expected);
  // Columns [2, 5).
  expected.clear();
  for (int r = 0; r < 4; ++r) {
    for (int c = 2; c < 5; ++c) expected.push_back(static_cast<float>(r * 6 + c));
  }
  EXPECT_EQ(slice("m", {1, 2, 5}), expected);
  EXPECT_EQ(slice("b", {1, 2, 5}), expected);
  // Dimension 1 of 2x3x4, indices [1, 3).
  expected.clear();
  for (int o = 0; o < 2; ++o) {
    for (int i = (o * 3 + 1) * 4; i < (o * 3 + 3) * 4; ++i) expected.push_back(static_cast<float>(i));
  }
  EXPECT_EQ(slice("c", {1, 1, 3}), expected);
  // The last dimension, and whole and empty slices.
  EXPECT_EQ(slice("c", {2, 3, 4}), (std::vector<float>{3, 7, 11, 15, 19, 23}));
  EXPECT_EQ(slice("m", {0, 0, 4}), values);
  EXPECT_TRUE(slice("m", {1, 3, 3}).empty());
  EXPECT_TRUE(slice("z", {1, 0, 2}).empty());

  // Raw bytes of the bf16 columns are the tensor's own bits.
  std::vector<uint16_t> raw(12);
  ASSERT_TRUE(file.ReadSliceBytes("b", {1, 2, 5}, raw.data(), 24).ok());
  for (size_t i = 0; i < raw.size(); ++i) {
    EXPECT_EQ(Bfloat16BitsToFloat32(raw[i]), expected.size() > 0 ? slice("b", {1, 2, 5})[i] : 0);
  }

  // Bad slices and counts: an error naming the tensor, nothing written.
  float out[64];
  const std::vector<std::pair<TensorSlice, int64_t>> bad = {
      {{0, 0, 5}, 30}, {{0, 3, 2}, 0}, {{0, -1, 2}, 18}, {{2, 0, 1}, 4}, {{-1, 0, 1}, 6},
      {{0, 0, 2}, 11}, {{0, 0, 2}, 13}};
  for (const auto& [s, count] : bad) {
    const absl::Status status = file.ReadSliceAsFloat32("m", s, out, count);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "slices: tensor 'm'")) << status;
  }
  EXPECT_EQ(file.ReadSliceAsFloat32("s", {0, 0, 1}, out, 1).code(),
            absl::StatusCode::kInvalidArgument);  // a scalar
  EXPECT_EQ(file.ReadSliceBytes("b", {1, 2, 5}, raw.data(), 23).code(),
            absl::StatusCode::kInvalidArgument);
}

struct InvalidCase {
  std::string description;
  std::string image;
  std::vector<std::string> expected;  // substrings of the message
};

std::vector<InvalidCase> InvalidCases() {
  const std::string a8 = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string data12(12, '\0');
  auto two = [&](const std::string& b) { return "{" + a8 + ",\"b\":" + b + "}"; };
  std::string deep = R"({"__metadata__":)";
  for (int i = 0; i < 300; ++i) deep += "[";
  for (int i = 0; i < 300; ++i) deep += "]";
  deep += "}";
  return {
      {"hole", Image(two(R"({"dtype":"F16","shape":[2],"data_offsets":[9,13]})"),
                     std::string(13, '\0')),
       {"'b'", "[8, 9) of the data unused"}},
      {"overlap", Image(two(R"({"dtype":"F16","shape":[2],"data_offsets":[4,8]})"),
                        std::string(8, '\0')),
       {"'b'", "overlap tensor 'a'"}},
      {"out of bounds", Image(two(R"({"dtype":"F16","shape":[2],"data_offsets":[8,12]})"),
                              std::string(10, '\0')),
       {"'b'", "run past the end of the data"}},
      {"size mismatch", Image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                              std::string(8, '\0')),
       {"'a'", "takes 12 bytes"}},
      {"unknown dtype", Image(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})",
                              std::string(8, '\0')),
       {"'a'", "unknown dtype 'F33'"}},
      {"negative dimension",
       Image(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0')),
       {"'a'", "shape holds -2"}},
      {"fractional dimension",
       Image(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", std::string(8, '\0')),
       {"'a'", "not a non-negative integer"}},
      {"overflowing shape",
       Image(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})",
             std::string(8, '\0')),
       {"'a'", "overflows"}},
      {"dimension past int64",
       Image(R"({"a":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8]}})",
             std::string(8, '\0')),
       {"'a'", "too large"}},
      {"offset past uint64",
       Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551616]}})",
             std::string(8, '\0')),
       {"'a'", "data_offsets"}},
      {"truncated data",
       Image(two(R"({"dtype":"F16","shape":[2],"data_offsets":[8,12]})"), std::string(9, '\0')),
       {"'b'", "truncated"}},
      {"trailing bytes",
       Image(two(R"({"dtype":"F16","shape":[2],"data_offsets":[8,12]})"), data12 + "xx"),
       {"trailing"}},
      {"header size past the file", LittleEndian64(1000) + "{}", {"runs past the end"}},
      {"header size past the limit", LittleEndian64(100'000'001) + "{}", {"100000000"}},
      {"header size of 2^64-1", LittleEndian64(~uint64_t{0}) + "{}", {"header size"}},
      {"short file", std::string("\x02\x00\x00", 3), {"too short"}},
      {"empty file", "", {"too short"}},
      {"array header", Image("[]", ""), {"not a JSON object"}},
      {"number header", Image("7", ""), {"not a JSON object"}},
      {"string header", Image("\"x\"", ""), {"not a JSON object"}},
      {"empty header", Image("", ""), {"malformed JSON"}},
      {"malformed header", Image("{\"a\":", ""), {"malformed JSON"}},
      {"invalid UTF-8", Image("{\"\xff\":{}}", ""), {"malformed JSON"}},
      {"repeated tensor",
       Image("{" + a8 + "," + a8 + "}", std::string(8, '\0')), {"'a'", "appears twice"}},
      {"repeated field",
       Image(R"({"a":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}})",
             std::string(8, '\0')),
       {"'dtype'", "appears twice"}},
      {"deep nesting", Image(deep, ""), {"nested 301 levels"}},
      {"metadata not a string",
       Image(R"({"__metadata__":{"format":1}})", ""), {"__metadata__.'format'", "not a string"}},
      {"metadata not an object", Image(R"({"__metadata__":[]})", ""), {"__metadata__"}},
      {"one offset", Image(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0]}})", ""),
       {"'a'", "data_offsets"}},
      {"reversed offsets",
       Image(two(R"({"dtype":"F16","shape":[2],"data_offsets":[12,8]})"), data12),
       {"'b'", "end before"}},
      {"missing dtype", Image(R"({"a":{"shape":[0],"data_offsets":[0,0]}})", ""),
       {"'a'", "missing dtype"}},
      {"missing shape", Image(R"({"a":{"dtype":"F32","data_offsets":[0,0]}})", ""),
       {"'a'", "missing shape"}},
      {"entry not an object", Image(R"({"a":5})", ""), {"'a'", "expected an object"}},
      {"control characters in a name",
       Image(R"({"a\nb":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')),
       {"'a\\x0ab'"}},
  };
}

TEST(ReaderTest, RefusesInvalidFilesNamingFileAndKey) {
  const std::string folder = MakeTempFolder();
  for (const InvalidCase& c : InvalidCases()) {
    const std::string path = folder + "/case.safetensors";
    ASSERT_TRUE(WriteFileAtomically(path, c.image).ok());
    auto file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok()) << c.description;
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument)
        << c.description << ": " << file.status();
    EXPECT_TRUE(absl::StartsWith(file.status().message(), path))
        << c.description << ": " << file.status();
    EXPECT_EQ(file.status().message().find('\n'), absl::string_view::npos)
        << c.description << ": " << file.status();
    for (const std::string& expected : c.expected) {
      EXPECT_TRUE(absl::StrContains(file.status().message(), expected))
          << c.description << ": expected \"" << expected << "\" in: " << file.status();
    }
  }
}

TEST(ReaderTest, AcceptsWhatTheFormatAllows) {
  // Unpadded header (data not aligned), whitespace around the JSON, extra fields, null metadata,
  // entries in any order, no tensor at all.
  const std::string data = BytesOf(std::vector<float>{1.5f, -2.5f}) + std::string("\x00\x3c", 2);
  const std::string header =
      R"( {"b":{"data_offsets":[8,10],"shape":[],"dtype":"F16"},"__metadata__":null,)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":[1,{"x":2}]}}   )";
  ASSERT_NE((header.size()) % 8, 0u);
  const std::string image = Image(header, data);
  auto file = SafetensorsFile::FromBytes(SpanOf(image), "loose");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->TensorNamesInFileOrder(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE((*file)->Metadata().empty());
  EXPECT_EQ(ReadFloats(**file, "a"), (std::vector<float>{1.5f, -2.5f}));
  EXPECT_EQ(ReadFloats(**file, "b"), std::vector<float>{1.0f});

  const std::string empty = Image("{}", "");
  auto none = SafetensorsFile::FromBytes(SpanOf(empty), "none");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE((*none)->TensorNamesInFileOrder().empty());

  // Empty tensors share an offset; file order breaks the tie by name.
  const std::string zeros = Image(
      R"({"z":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"y":{"dtype":"I8","shape":[0,9],"data_offsets":[0,0]},"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
      "q");
  auto tied = SafetensorsFile::FromBytes(SpanOf(zeros), "tied");
  ASSERT_TRUE(tied.ok()) << tied.status();
  EXPECT_EQ((*tied)->TensorNamesInFileOrder(), (std::vector<std::string>{"y", "z", "x"}));
}

TEST(ReaderTest, MissingFilesFoldersAndFifos) {
  const std::string folder = MakeTempFolder();
  auto missing = SafetensorsFile::Open(folder + "/missing.safetensors");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "missing.safetensors"));
  EXPECT_EQ(SafetensorsFile::Open(folder).status().code(), absl::StatusCode::kInvalidArgument);
  const std::string fifo = folder + "/fifo.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto opened = SafetensorsFile::Open(fifo);  // must not hang
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument) << opened.status();
}

TEST(ReaderTest, ConcurrentReadsOfOneFile) {
  const std::string folder = MakeTempFolder();
  std::vector<float> values(4096);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  ASSERT_TRUE(WriteSafetensorsFile(folder + "/m.safetensors",
                                   ToWrite({{"w", DataType::kFloat32, {64, 64}, BytesOf(values)}}))
                  .ok());
  auto file = SafetensorsFile::Open(folder + "/m.safetensors");
  ASSERT_TRUE(file.ok());
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round) {
        std::vector<float> rows(16 * 64);
        if (!(*file)->ReadSliceAsFloat32("w", {0, t * 16, t * 16 + 16}, rows.data(), 1024).ok()) {
          ++mismatches[static_cast<size_t>(t)];
        }
        for (size_t i = 0; i < rows.size(); ++i) {
          if (rows[i] != values[static_cast<size_t>(t) * 1024 + i]) ++mismatches[static_cast<size_t>(t)];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

// ---- Hugging Face folders --------------------------------------------------------------------

std::vector<OwnedTensor> ShardTensors() {
  auto filled = [](int64_t count, float start) {
    std::vector<float> v(static_cast<size_t>(count));
    for (size_t i = 0; i < v.size(); ++i) v[i] = start + static_cast<float>(i);
    return BytesOf(v);
  };
  return {{"a.weight", DataType::kFloat32, {16}, filled(16, 0)},
          {"b.weight", DataType::kFloat32, {4, 4}, filled(16, 100)},
          {"big", DataType::kFloat32, {8, 8}, filled(64, 200)},
          {"c.weight", DataType::kFloat32, {16}, filled(16, 300)},
          {"d.weight", DataType::kFloat32, {16}, filled(16, 400)},
          {"e.weight", DataType::kFloat32, {2, 8}, filled(16, 500)}};
}

TEST(FolderTest, ShardedWriteThenLazyReads) {
  const std::string folder = MakeTempFolder() + "/nested/model";  // created by the writer
  const std::vector<OwnedTensor> tensors = ShardTensors();
  ShardedWriteOptions options;
  options.max_shard_bytes = 150;
  auto written = WriteShardedSafetensors(folder, ToWrite(tensors), options);
  ASSERT_TRUE(written.ok()) << written.status();
  // As transformers splits: "big" alone, first; then a+b, c+d, e.
  EXPECT_EQ(written->files, (std::vector<std::string>{
                                "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                                "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors"}));
  EXPECT_EQ(written->index_file, "model.safetensors.index.json");
  EXPECT_EQ(written->total_bytes, 5 * 64 + 256);
  auto index = ReadJsonFile(folder + "/model.safetensors.index.json");
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ((*index)["metadata"]["total_size"], 576);
  EXPECT_EQ((*index)["weight_map"]["big"], "model-00001-of-00004.safetensors");
  EXPECT_EQ((*index)["weight_map"]["a.weight"], "model-00002-of-00004.safetensors");
  EXPECT_EQ((*index)["weight_map"]["b.weight"], "model-00002-of-00004.safetensors");
  EXPECT_EQ((*index)["weight_map"]["e.weight"], "model-00004-of-00004.safetensors");

  auto opened = SafetensorsFolder::Open(folder);
  ASSERT_TRUE(opened.ok()) << opened.status();
  const SafetensorsFolder& model = **opened;
  EXPECT_EQ(model.TensorNames(), (std::vector<std::string>{"a.weight", "b.weight", "big",
                                                           "c.weight", "d.weight", "e.weight"}));
  EXPECT_EQ(model.IndexMetadata()["total_size"], 576);
  EXPECT_EQ(model.OpenedFileCount(), 0);
  std::vector<float> out(16);
  ASSERT_TRUE(model.ReadAsFloat32("c.weight", out.data(), 16).ok());
  EXPECT_EQ(out[3], 303.0f);
  EXPECT_EQ(model.OpenedFileCount(), 1);
  ASSERT_TRUE(model.ReadSliceAsFloat32("d.weight", {0, 4, 8}, out.data(), 4).ok());
  EXPECT_EQ(out[0], 404.0f);
  EXPECT_EQ(model.OpenedFileCount(), 1);  // c and d share a shard
  ASSERT_TRUE(model.ReadSliceAsFloat32("big", {1, 6, 8}, out.data(), 16).ok());
  EXPECT_EQ(out[0], 206.0f);
  EXPECT_EQ(out[15], 263.0f);
  EXPECT_EQ(model.OpenedFileCount(), 2);
  EXPECT_TRUE(model.ValidateAll().ok());
  EXPECT_EQ(model.OpenedFileCount(), 4);
  for (const OwnedTensor& t : tensors) {
    EXPECT_EQ(StringOf(*model.Bytes(t.name)), t.bytes) << t.name;
    EXPECT_EQ(model.Info(t.name)->shape, t.shape);
  }
  EXPECT_EQ((*model.FileOf("e.weight"))->Metadata().at("format"), "pt");

  // Many threads asking at once open each shard once.
  auto again = SafetensorsFolder::Open(folder);
  ASSERT_TRUE(again.ok());
  std::vector<std::thread> threads;
  std::vector<int> failures(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      const std::string& name = tensors[static_cast<size_t>(t) % tensors.size()].name;
      if (!(*again)->Bytes(name).ok()) ++failures[static_cast<size_t>(t)];
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures, std::vector<int>(8, 0));
  EXPECT_EQ((*again)->OpenedFileCount(), 4);
}

TEST(FolderTest, RewritingReplacesTheEarlierSaveWhole) {
  const std::string folder = MakeTempFolder();
  ASSERT_TRUE(WriteFileAtomically(folder + "/config.json", "{}").ok());
  ShardedWriteOptions options;
  options.max_shard_bytes = 150;
  ASSERT_TRUE(WriteShardedSafetensors(folder, ToWrite(ShardTensors()), options).ok());
  // One file now: the index and the four shards go; other files stay.
  auto single = WriteShardedSafetensors(folder, ToWrite(ShardTensors()));
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ(single->files, std::vector<std::string>{"model.safetensors"});
  EXPECT_TRUE(single->index_file.empty());
  EXPECT_EQ(FolderEntries(folder), (std::vector<std::string>{"config.json", "model.safetensors"}));
  auto opened = SafetensorsFolder::Open(folder);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ((*opened)->TensorNames().size(), 6u);
  EXPECT_TRUE((*opened)->IndexMetadata().empty());
  EXPECT_EQ((*opened)->OpenedFileCount(), 1);
  // And back to two shards (a, b, big; c, d, e): the single file goes.
  options.max_shard_bytes = 400;
  auto sharded = WriteShardedSafetensors(folder, ToWrite(ShardTensors()), options);
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  EXPECT_EQ(FolderEntries(folder),
            (std::vector<std::string>{"config.json", "model-00001-of-00002.safetensors",
                                      "model-00002-of-00002.safetensors",
                                      "model.safetensors.index.json"}));
  // Opening a single file or an index directly works too.
  EXPECT_TRUE(SafetensorsFolder::Open(folder + "/model.safetensors.index.json").ok());
  auto shard = SafetensorsFolder::Open(folder + "/model-00002-of-00002.safetensors");
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ((*shard)->OpenedFileCount(), 1);

  // Bad options and bad tensors write nothing.
  options.max_shard_bytes = 0;
  EXPECT_EQ(WriteShardedSafetensors(folder + "/x", ToWrite(ShardTensors()), options).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<OwnedTensor> bad = ShardTensors();
  bad[3].bytes.pop_back();
  auto refused = WriteShardedSafetensors(folder + "/y", ToWrite(bad));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "'c.weight'")) << refused.status();
  EXPECT_FALSE(Exists(folder + "/y"));
}

TEST(FolderTest, IndexAndShardDisagreementsNameTheKey) {
  const std::string folder = MakeTempFolder();
  const std::string four = BytesOf(std::vector<float>{1});
  ASSERT_TRUE(WriteSafetensorsFile(folder + "/one.safetensors",
                                   ToWrite({{"a", DataType::kFloat32, {1}, four},
                                            {"b", DataType::kFloat32, {1}, four}}))
                  .ok());
  ASSERT_TRUE(WriteSafetensorsFile(folder + "/two.safetensors",
                                   ToWrite({{"c", DataType::kFloat32, {1}, four}}))
                  .ok());
  const std::string index = folder + "/model.safetensors.index.json";
  auto open_with = [&](const std::string& text) {
    EXPECT_TRUE(WriteFileAtomically(index, text).ok());
    return SafetensorsFolder::Open(folder);
  };
  auto expect_error = [](const absl::Status& status, absl::StatusCode code,
                         std::vector<std::string> expected) {
    EXPECT_EQ(status.code(), code) << status;
    for (const std::string& e : expected) {
      EXPECT_TRUE(absl::StrContains(status.message(), e)) << "\"" << e << "\" in: " << status;
    }
  };

  // Consistent: fine.
  auto good = open_with(
      R"({"metadata":{"total_size":12},"weight_map":{"a":"one.safetensors","b":"one.safetensors","c":"two.safetensors"}})");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE((*good)->ValidateAll().ok());
  expect_error((*good)->Info("zzz").status(), absl::StatusCode::kNotFound, {index, "'zzz'"});

  // The index points at a file that does not exist.
  auto missing = open_with(
      R"({"weight_map":{"a":"one.safetensors","b":"one.safetensors","c":"two.safetensors","x":"model-00009-of-00009.safetensors"}})");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_TRUE((*missing)->Info("a").ok());  // other shards still read
  expect_error((*missing)->Info("x").status(), absl::StatusCode::kNotFound,
               {"'x'", "model-00009-of-00009.safetensors"});
  expect_error((*missing)->ValidateAll(), absl::StatusCode::kNotFound,
               {"model-00009-of-00009.safetensors"});

  // A tensor in a shard that the index does not list.
  auto unlisted = open_with(R"({"weight_map":{"a":"one.safetensors","c":"two.safetensors"}})");
  ASSERT_TRUE(unlisted.ok());
  expect_error((*unlisted)->Info("a").status(), absl::StatusCode::kInvalidArgument,
               {"one.safetensors", "'b'", "does not list"});
  EXPECT_TRUE((*unlisted)->Info("c").ok());

  // A tensor the index places in a shard that lacks it.
  auto absent = open_with(
      R"({"weight_map":{"a":"one.safetensors","b":"one.safetensors","c":"two.safetensors","d":"two.safetensors"}})");
  ASSERT_TRUE(absent.ok());
  expect_error((*absent)->Info("d").status(), absl::StatusCode::kInvalidArgument,
               {"two.safetensors", "'d'", "says it holds"});
  expect_error((*absent)->ValidateAll(), absl::StatusCode::kInvalidArgument, {"'d'"});

  // A tensor the index places in another shard.
  auto moved = open_with(
      R"({"weight_map":{"a":"one.safetensors","b":"two.safetensors","c":"two.safetensors"}})");
  ASSERT_TRUE(moved.ok());
  expect_error((*moved)->Info("a").status(), absl::StatusCode::kInvalidArgument,
               {"'b'", "places in two.safetensors"});

  // Malformed indexes.
  expect_error(open_with(R"({"weight_map":{"a":"../one.safetensors"}})").status(),
               absl::StatusCode::kInvalidArgument, {"weight_map.'a'", "not the name of a file"});
  expect_error(open_with(R"({"weight_map":{"a":5}})").status(),
               absl::StatusCode::kInvalidArgument, {"weight_map.'a'"});
  expect_error(open_with(R"({"weight_map":{"a":""}})").status(),
               absl::StatusCode::kInvalidArgument, {"weight_map.'a'"});
  expect_error(open_with(R"({"metadata":{}})").status(), absl::StatusCode::kInvalidArgument,
               {index, "weight_map"});
  expect_error(open_with(R"({"weight_map":{},"metadata":3})").status(),
               absl::StatusCode::kInvalidArgument, {"metadata"});
  expect_error(open_with("[]").status(), absl::StatusCode::kInvalidArgument,
               {"not a JSON object"});
  expect_error(open_with("{").status(), absl::StatusCode::kInvalidArgument, {"malformed JSON"});
  expect_error(
      open_with(R"({"weight_map":{"a":"one.safetensors","a":"two.safetensors"}})").status(),
      absl::StatusCode::kInvalidArgument, {"'a'", "appears twice"});

  // A folder with neither an index nor model.safetensors.
  expect_error(SafetensorsFolder::Open(MakeTempFolder()).status(), absl::StatusCode::kNotFound,
               {"model.safetensors"});
  expect_error(SafetensorsFolder::Open(folder + "/none").status(), absl::StatusCode::kNotFound,
               {"none"});
}

// ---- The reference Python package ------------------------------------------------------------

struct CommandResult {
  int exit_code = -1;
  std::string output;  // standard output
  std::string errors;  // standard error
};

CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  const std::string errors_path = MakeTempFolder() + "/stderr";
  FILE* pipe = ::popen((command + " 2>'" + errors_path + "'").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, got);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto errors = ReadFile(errors_path);
  if (errors.ok()) result.errors = *errors;
  return result;
}

// Why the reference package cannot be used, or "" when it can.
std::string ReferenceUnavailableReason() {
  const CommandResult probe = RunCommand("python3 -c 'import safetensors, numpy'");
  if (probe.exit_code == 0) return "";
  return absl::StrCat("python3 cannot import safetensors and numpy (exit ", probe.exit_code,
                      "): pip install safetensors numpy to run this test. ", probe.errors);
}

std::string Reference(const std::string& verb, const std::string& path) {
  return absl::StrCat("python3 '", TANDEM_SAFETENSORS_REFERENCE_SCRIPT, "' ", verb, " '", path,
                      "'");
}

TEST(ReferencePythonTest, ReadsWhatTheReferenceWritesAndWritesTheSameBytes) {
  const std::string reason = ReferenceUnavailableReason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  const std::string folder = MakeTempFolder();
  const std::string path = folder + "/reference.safetensors";
  const CommandResult written = RunCommand(Reference("write", path));
  ASSERT_EQ(written.exit_code, 0) << written.output << written.errors;

  auto opened = SafetensorsFile::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status();
  const SafetensorsFile& file = **opened;
  EXPECT_EQ(file.Metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ(file.TensorNamesSorted(),
            (std::vector<std::string>{"empty", "mask", "model.embed.weight",
                                      "model.layers.0.weight", "model.norm.bias", "model.scale",
                                      "step"}));
  std::vector<float> embed;
  for (int i = 0; i < 12; ++i) embed.push_back(static_cast<float>(i) * 0.25f - 1.0f);
  EXPECT_EQ(ReadFloats(file, "model.embed.weight"), embed);
  EXPECT_EQ((*file.Info("model.embed.weight"))->shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(ReadFloats(file, "model.norm.bias"),
            (std::vector<float>{1, -2, 65504, std::ldexp(1.0f, -24), 0.333251953125f}));
  const std::vector<float> brain = ReadFloats(file, "model.layers.0.weight");
  ASSERT_EQ(brain.size(), 6u);
  EXPECT_EQ(brain[0], 1.0f);
  EXPECT_EQ(brain[1], -2.0f);
  EXPECT_EQ(brain[2], 3.140625f);
  EXPECT_EQ(brain[3], std::ldexp(1.0f, -133));
  EXPECT_TRUE(brain[4] == 0.0f && std::signbit(brain[4]));
  EXPECT_EQ(brain[5], std::numeric_limits<float>::infinity());
  EXPECT_EQ(ReadFloats(file, "model.scale"), std::vector<float>{0.1f});
  EXPECT_TRUE((*file.Info("model.scale"))->shape.empty());
  EXPECT_EQ(StringOf(*file.Bytes("step")), BytesOf(std::vector<int64_t>{7, -1}));
  EXPECT_EQ(StringOf(*file.Bytes("mask")), std::string("\x01\x00\x00\x01", 4));
  EXPECT_EQ((*file.Info("empty"))->shape, (std::vector<int64_t>{0, 5}));

  // Our writer, given what was read, writes the reference's file byte for byte.
  std::vector<TensorToWrite> again;
  for (const std::string& name : file.TensorNamesSorted()) {
    const TensorInfo& info = **file.Info(name);
    again.push_back({name, info.data_type, info.shape, *file.Bytes(name), nullptr});
  }
  auto ours = SerializeSafetensors(again, file.Metadata());
  ASSERT_TRUE(ours.ok()) << ours.status();
  EXPECT_EQ(*ours, ReadWhole(path));
}

TEST(ReferencePythonTest, ReferenceReadsWhatWeWrite) {
  const std::string reason = ReferenceUnavailableReason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  const std::string folder = MakeTempFolder();

  auto check = [&](const std::string& path, const std::vector<OwnedTensor>& tensors,
                   const std::map<std::string, std::string>& metadata) {
    const CommandResult result = RunCommand(Reference("check", path));
    EXPECT_EQ(result.exit_code, 0) << result.errors;
    auto parsed = ParseJson(result.output, "reference check output");
    EXPECT_TRUE(parsed.ok()) << parsed.status() << result.output;
    if (!parsed.ok()) return Json();
    const Json& seen = *parsed;
    EXPECT_EQ(seen["metadata"], Json(metadata));
    EXPECT_EQ(seen["tensors"].size(), tensors.size());
    for (const OwnedTensor& t : tensors) {
      const Json& entry = seen["tensors"][t.name];
      EXPECT_EQ(entry["dtype"], std::string(DataTypeName(t.data_type))) << t.name;
      EXPECT_EQ(entry["shape"], Json(t.shape)) << t.name;
      std::string hex;
      for (unsigned char c : t.bytes) absl::StrAppendFormat(&hex, "%02x", c);
      EXPECT_EQ(entry["hex"], hex) << t.name;
    }
    return seen;
  };

  // Every dtype of the mix (bf16 and f4 included), checked byte for byte.
  std::vector<OwnedTensor> mixed = MixedTensors();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"tool", "tandem"}};
  ASSERT_TRUE(WriteSafetensorsFile(folder + "/mixed.safetensors", ToWrite(mixed), metadata).ok());
  check(folder + "/mixed.safetensors", mixed, metadata);

  // Without bf16, numpy's load_file gives the values.
  std::vector<float> matrix(6);
  for (size_t i = 0; i < matrix.size(); ++i) matrix[i] = static_cast<float>(i) / 3.0f;
  std::vector<uint16_t> half;
  for (float v : {0.5f, -1.25f, 1e-6f}) half.push_back(Float32ToFloat16Bits(v));
  const std::vector<OwnedTensor> plain = {
      {"w", DataType::kFloat32, {2, 3}, BytesOf(matrix)},
      {"h", DataType::kFloat16, {3}, BytesOf(half)},
  };
  ASSERT_TRUE(WriteSafetensorsFile(folder + "/plain.safetensors", ToWrite(plain), {{"format", "pt"}}).ok());
  const Json seen = check(folder + "/plain.safetensors", plain, {{"format", "pt"}});
  ASSERT_TRUE(seen.contains("values"));
  for (size_t i = 0; i < matrix.size(); ++i) {
    EXPECT_EQ(seen["values"]["w"][i].get<double>(), static_cast<double>(matrix[i]));
  }
  for (size_t i = 0; i < half.size(); ++i) {
    EXPECT_EQ(seen["values"]["h"][i].get<double>(), Float16BitsToFloat32(half[i]));
  }

  // Each shard of a sharded save.
  ShardedWriteOptions options;
  options.max_shard_bytes = 150;
  const std::vector<OwnedTensor> shards = ShardTensors();
  auto written = WriteShardedSafetensors(folder + "/sharded", ToWrite(shards), options);
  ASSERT_TRUE(written.ok()) << written.status();
  auto index = ReadJsonFile(folder + "/sharded/" + written->index_file);
  ASSERT_TRUE(index.ok());
  for (const std::string& file_name : written->files) {
    std::vector<OwnedTensor> in_file;
    for (const OwnedTensor& t : shards) {
      if ((*index)["weight_map"][t.name] == file_name) in_file.push_back(t);
    }
    check(folder + "/sharded/" + file_name, in_file, options.metadata);
  }
}

}  // namespace
}  // namespace tandem::formats
