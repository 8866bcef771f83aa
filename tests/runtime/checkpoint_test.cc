#include "runtime/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/file_util.h"
#include "gtest/gtest.h"
#include "runtime/stage_checkpoint.h"

namespace tandem::runtime {
namespace {

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            ("tandem_checkpoint_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    tandem::RemoveAll(dir_).IgnoreError();
    ASSERT_TRUE(EnsureDirectory(dir_).ok());
  }
  void TearDown() override { tandem::RemoveAll(dir_).IgnoreError(); }

  static CheckpointShard SampleShard(int stage) {
    CheckpointShard shard;
    shard.stage = stage;
    std::vector<float> values = {1.5f, -2.0f, 3.25f};
    ShardTensor t;
    t.name = "weight";
    t.count = 3;
    t.bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    shard.tensors.push_back(t);
    ShardTensor step;
    step.name = "adam.step";
    step.dtype = comm::DataType::kInt64;
    step.count = 1;
    int64_t v = 7;
    step.bytes.assign(reinterpret_cast<const char*>(&v), sizeof(v));
    shard.tensors.push_back(step);
    shard.metadata = {{"optimizer", "adamw"}};
    return shard;
  }

  // Writes two shards and the manifest; returns the manifest.
  CheckpointManifest WriteComplete() {
    CheckpointManifest m;
    m.model = "gpt L=2";
    m.plan = {{"world_size", 2}};
    m.step = 10;
    m.data_position = {{"next_iteration", 10}};
    for (int s = 0; s < 2; ++s) {
      auto record = WriteShard(dir_, SampleShard(s));
      EXPECT_TRUE(record.ok()) << record.status();
      m.shards.push_back(*record);
    }
    EXPECT_TRUE(WriteManifest(dir_, m).ok());
    return m;
  }

  std::string dir_;
};

TEST_F(CheckpointTest, ShardRoundTrip) {
  CheckpointShard shard = SampleShard(3);
  auto parsed = ParseShard(SerializeShard(shard), "mem");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->stage, 3);
  ASSERT_EQ(parsed->tensors.size(), 2u);
  EXPECT_EQ(parsed->tensors[0], shard.tensors[0]);
  EXPECT_EQ(parsed->tensors[1], shard.tensors[1]);
  EXPECT_EQ(parsed->metadata["optimizer"], "adamw");
  ASSERT_NE(parsed->Find("adam.step"), nullptr);
  EXPECT_EQ(parsed->Find("missing"), nullptr);
}

// NaN or infinity in any floating type is damage (a checksum recomputed over it would hide
// it): the shard is refused naming the tensor and the first bad element. Integers and finite
// extremes pass.
TEST_F(CheckpointTest, NonFiniteValuesInAnyFloatingTypeAreRefused) {
  struct Case {
    comm::DataType dtype;
    std::vector<uint8_t> element;  // little-endian bit pattern of one element
    bool finite;
  };
  const std::vector<Case> cases = {
      {comm::DataType::kFloat32, {0x00, 0x00, 0xc0, 0x7f}, false},              // NaN
      {comm::DataType::kFloat32, {0x00, 0x00, 0x80, 0xff}, false},              // -inf
      {comm::DataType::kFloat32, {0xff, 0xff, 0x7f, 0x7f}, true},               // largest
      {comm::DataType::kFloat64, {0, 0, 0, 0, 0, 0, 0xf0, 0x7f}, false},        // inf
      {comm::DataType::kFloat64, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xef, 0x7f}, true},
      {comm::DataType::kBFloat16, {0xc0, 0x7f}, false},                         // NaN
      {comm::DataType::kBFloat16, {0x7f, 0x7f}, true},
      {comm::DataType::kFloat16, {0x00, 0x7c}, false},                          // inf
      {comm::DataType::kFloat16, {0xff, 0x7b}, true},                           // 65504
      {comm::DataType::kInt32, {0x00, 0x00, 0xc0, 0x7f}, true},                 // an integer
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(comm::DataTypeName(c.dtype));
    CheckpointShard shard = SampleShard(0);
    ShardTensor t;
    t.name = "param:x";
    t.dtype = c.dtype;
    t.count = 3;
    const std::string zero(c.element.size(), '\0');
    t.bytes = zero + std::string(c.element.begin(), c.element.end()) + zero;
    shard.tensors.push_back(t);
    auto parsed = ParseShard(SerializeShard(shard), "mem");
    if (c.finite) {
      EXPECT_TRUE(parsed.ok()) << parsed.status();
      continue;
    }
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(parsed.status().message().find("'param:x' holds 1 non-finite value(s)"),
              std::string::npos)
        << parsed.status();
    EXPECT_NE(parsed.status().message().find("the first at element 1"), std::string::npos)
        << parsed.status();
  }
}

// The manifest and `latest` are read only as regular files of bounded size: a FIFO (which
// would block), a link to /dev/zero (which never ends) or an oversized file is refused at once.
TEST_F(CheckpointTest, SpecialOrOversizedFilesAreRefusedWithoutBeingRead) {
  WriteComplete();
  const std::string manifest = dir_ + "/" + kManifestFileName;
  ASSERT_EQ(std::remove(manifest.c_str()), 0);
  ASSERT_EQ(::mkfifo(manifest.c_str(), 0600), 0);
  auto read = ReadManifest(dir_);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << read.status();
  EXPECT_NE(read.status().message().find("a FIFO"), std::string::npos) << read.status();

  const std::string root = dir_ + "/root";
  ASSERT_TRUE(EnsureDirectory(root).ok());
  const std::string latest = root + "/" + kLatestFileName;
  std::filesystem::create_symlink("/dev/zero", latest);
  auto resolved = ResolveCheckpoint(root);
  EXPECT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument) << resolved.status();
  EXPECT_NE(resolved.status().message().find("character device"), std::string::npos)
      << resolved.status();
  ASSERT_EQ(std::remove(latest.c_str()), 0);
  ASSERT_TRUE(tandem::WriteFileAtomically(latest, std::string(kMaxLatestBytes + 1, 's')).ok());
  EXPECT_EQ(ResolveCheckpoint(root).status().code(), absl::StatusCode::kResourceExhausted);
  // Garbage is named, one line, its control bytes escaped (never sent to the terminal).
  ASSERT_TRUE(tandem::WriteFileAtomically(latest, "step-1\n\x1b[31mRED\nx").ok());
  const absl::Status garbage = ResolveCheckpoint(root).status();
  EXPECT_EQ(garbage.code(), absl::StatusCode::kDataLoss) << garbage;
  EXPECT_EQ(garbage.message().find('\n'), std::string::npos) << garbage;
  EXPECT_EQ(garbage.message().find('\x1b'), std::string::npos) << garbage;
  EXPECT_NE(garbage.message().find("\\x1b[31mRED"), std::string::npos) << garbage;
  ASSERT_TRUE(tandem::WriteFileAtomically(latest, "step-00000010\n").ok());
  EXPECT_TRUE(ResolveCheckpoint(root).ok());
}

TEST_F(CheckpointTest, ManifestRoundTripAndShardsLoad) {
  CheckpointManifest written = WriteComplete();
  auto read = ReadManifest(dir_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->model, "gpt L=2");
  EXPECT_EQ(read->step, 10);
  EXPECT_EQ(read->shards, written.shards);
  auto shard = ReadShard(dir_, *read->FindShard(1, 0));
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->stage, 1);
  EXPECT_EQ(shard->tensors[0], SampleShard(1).tensors[0]);
}

TEST_F(CheckpointTest, MissingManifestIsNotFound) {
  auto record = WriteShard(dir_, SampleShard(0));  // shards written, manifest never
  ASSERT_TRUE(record.ok());
  auto read = ReadManifest(dir_);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(read.status().message().find("manifest.json"), std::string::npos);
}

TEST_F(CheckpointTest, MissingShardIsNotFoundNamingTheFile) {
  CheckpointManifest m = WriteComplete();
  std::filesystem::remove(dir_ + "/" + m.shards[1].file);
  auto read = ReadManifest(dir_);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(read.status().message().find(m.shards[1].file), std::string::npos) << read.status();
}

// A shard replaced by a folder is named as such (the message gave the folder's 4096 bytes as
// the shard's size).
TEST_F(CheckpointTest, ShardReplacedByAFolderIsNamedAsSuch) {
  CheckpointManifest m = WriteComplete();
  std::filesystem::remove(dir_ + "/" + m.shards[0].file);
  std::filesystem::create_directory(dir_ + "/" + m.shards[0].file);
  auto read = ReadManifest(dir_);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(read.status().message().find(m.shards[0].file +
                                         ": shard listed in the manifest is a folder, not a file"),
            std::string::npos)
      << read.status();
}

TEST_F(CheckpointTest, TruncatedShardIsDataLoss) {
  CheckpointManifest m = WriteComplete();
  std::filesystem::resize_file(dir_ + "/" + m.shards[0].file, m.shards[0].bytes - 4);
  EXPECT_EQ(ReadManifest(dir_).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(CheckpointTest, FlippedByteFailsTheChecksum) {
  CheckpointManifest m = WriteComplete();
  const std::string path = dir_ + "/" + m.shards[0].file;
  auto contents = ReadFile(path);
  ASSERT_TRUE(contents.ok());
  (*contents)[contents->size() - 1] ^= 0x01;  // same size, one bit off in the last tensor
  ASSERT_TRUE(WriteFileAtomically(path, *contents).ok());
  ASSERT_TRUE(ReadManifest(dir_).ok());  // sizes still match
  auto shard = ReadShard(dir_, m.shards[0]);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(shard.status().message().find("checksum"), std::string::npos) << shard.status();
}

TEST_F(CheckpointTest, ShardFromAnotherCheckpointIsDetected) {
  CheckpointManifest m = WriteComplete();
  // A newer save overwrote shard 0 (different values) but crashed before its manifest.
  CheckpointShard newer = SampleShard(0);
  newer.tensors[0].bytes[0] ^= 0x40;
  ASSERT_TRUE(WriteShard(dir_, newer).ok());
  EXPECT_EQ(ReadShard(dir_, m.shards[0]).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(CheckpointTest, CorruptManifestNamesTheField) {
  WriteComplete();
  ASSERT_TRUE(WriteFileAtomically(dir_ + "/manifest.json",
                                  R"({"format_version": 1, "model": "m", "plan": {},
                                      "shards": []})")
                  .ok());
  auto read = ReadManifest(dir_);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(read.status().message().find("step"), std::string::npos) << read.status();

  ASSERT_TRUE(WriteFileAtomically(dir_ + "/manifest.json", "{not json").ok());
  EXPECT_EQ(ReadManifest(dir_).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CheckpointTest, GarbageShardIsDataLoss) {
  EXPECT_EQ(ParseShard("hello", "x").status().code(), absl::StatusCode::kDataLoss);
  std::string data = SerializeShard(SampleShard(0));
  EXPECT_EQ(ParseShard(data.substr(0, data.size() - 3), "x").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseShard(data + "xx", "x").status().code(), absl::StatusCode::kDataLoss);
}

// Every tensor's shape is recorded and read back; a shard written before shapes were
// recorded (no "shape" in its header) still loads, with empty shapes.
TEST_F(CheckpointTest, ShapesRoundTripAndShardsWithoutShapesStillLoad) {
  CheckpointShard shard = SampleShard(1);
  shard.tensors[0].shape = {1, 3};
  shard.tensors[1].shape = {};  // a scalar recorded as [] would be ambiguous: left unrecorded
  auto parsed = ParseShard(SerializeShard(shard), "mem");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tensors[0].shape, (std::vector<int64_t>{1, 3}));
  EXPECT_TRUE(parsed->tensors[1].shape.empty());
  EXPECT_EQ(parsed->tensors[0], shard.tensors[0]);

  // An older shard: the same header without "shape" fields.
  std::string data = SerializeShard(shard);
  uint64_t header_size = 0;
  std::memcpy(&header_size, data.data() + 12, sizeof(header_size));
  nlohmann::json header = nlohmann::json::parse(data.substr(20, header_size));
  ASSERT_TRUE(header["tensors"][0].contains("shape"));
  for (auto& t : header["tensors"]) t.erase("shape");
  const std::string old_header = header.dump();
  const uint64_t old_size = old_header.size();
  std::string old = data.substr(0, 12);
  old.append(reinterpret_cast<const char*>(&old_size), sizeof(old_size));
  old += old_header;
  old += data.substr(20 + header_size);
  auto older = ParseShard(old, "old");
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_TRUE(older->tensors[0].shape.empty());
  EXPECT_EQ(older->tensors[0].bytes, shard.tensors[0].bytes);

  // A shape that does not hold the element count is damage, named.
  for (const nlohmann::json& bad :
       {nlohmann::json::array({2, 2}), nlohmann::json::array({-1, -3}), nlohmann::json("3"),
        nlohmann::json::array({int64_t{1} << 40, int64_t{1} << 40, 0, 3})}) {
    header["tensors"][0]["shape"] = bad;
    const std::string text = header.dump();
    const uint64_t size = text.size();
    std::string damaged = data.substr(0, 12);
    damaged.append(reinterpret_cast<const char*>(&size), sizeof(size));
    damaged += text;
    damaged += data.substr(20 + header_size);
    auto refused = ParseShard(damaged, "bad");
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << bad.dump();
    EXPECT_NE(refused.status().message().find("tensor 'weight' has shape"), std::string::npos)
        << refused.status();
  }
  // Zero-sized dimensions hold zero elements whatever the others are.
  CheckpointShard empty;
  ShardTensor none;
  none.name = "empty";
  none.count = 0;
  none.shape = {int64_t{1} << 40, 0, 7};
  empty.tensors.push_back(none);
  auto parsed_empty = ParseShard(SerializeShard(empty), "empty");
  ASSERT_TRUE(parsed_empty.ok()) << parsed_empty.status();
  EXPECT_EQ(parsed_empty->tensors[0].shape, none.shape);
}

// ShardOf records each parameter's shape, and its optimizer buffers of the same size share it;
// an unknown shape is recorded flat.
TEST_F(CheckpointTest, ShardOfRecordsParameterShapes) {
  ParameterState matrix;
  matrix.name = "layers.1.weight";
  matrix.shape = {2, 3};
  matrix.value = {1, 2, 3, 4, 5, 6};
  matrix.optimizer.name = matrix.name;
  matrix.optimizer.steps = 1;
  matrix.optimizer.buffers = {{"exp_avg", std::vector<float>(6, 0.5f)}};
  ParameterState unknown;
  unknown.name = "layers.1.bias";
  unknown.value = {1, 2};
  const CheckpointShard shard = ShardOf(0, 0, 2, {matrix, unknown});
  auto parsed = ParseShard(SerializeShard(shard), "mem");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_NE(parsed->Find("param:layers.1.weight"), nullptr);
  EXPECT_EQ(parsed->Find("param:layers.1.weight")->shape, (std::vector<int64_t>{2, 3}));
  ASSERT_NE(parsed->Find("optim:layers.1.weight:exp_avg"), nullptr);
  EXPECT_EQ(parsed->Find("optim:layers.1.weight:exp_avg")->shape, (std::vector<int64_t>{2, 3}));
  ASSERT_NE(parsed->Find("param:layers.1.bias"), nullptr);
  EXPECT_EQ(parsed->Find("param:layers.1.bias")->shape, (std::vector<int64_t>{2}));

  EXPECT_EQ(ShapeString({4096, 512}), "[4096, 512]");
  EXPECT_EQ(ShapeString({}), "[]");
  EXPECT_TRUE(ShapesCompatible({2, 3}, {2, 3}));
  EXPECT_TRUE(ShapesCompatible({6}, {2, 3}));   // flat: written without the shape
  EXPECT_TRUE(ShapesCompatible({}, {2, 3}));    // an older shard
  EXPECT_TRUE(ShapesCompatible({2, 3}, {}));    // a stage that does not know it
  EXPECT_FALSE(ShapesCompatible({3, 2}, {2, 3}));
  EXPECT_FALSE(ShapesCompatible({5}, {2, 3}));
}

TEST_F(CheckpointTest, RemoveManifestInvalidatesTheCheckpoint) {
  WriteComplete();
  ASSERT_TRUE(RemoveManifest(dir_).ok());
  EXPECT_EQ(ReadManifest(dir_).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(RemoveManifest(dir_).ok());  // idempotent
}

}  // namespace
}  // namespace tandem::runtime
