#include "runtime/checkpoint.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/file_util.h"
#include "gtest/gtest.h"

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

TEST_F(CheckpointTest, RemoveManifestInvalidatesTheCheckpoint) {
  WriteComplete();
  ASSERT_TRUE(RemoveManifest(dir_).ok());
  EXPECT_EQ(ReadManifest(dir_).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(RemoveManifest(dir_).ok());  // idempotent
}

}  // namespace
}  // namespace tandem::runtime
