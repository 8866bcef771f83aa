// Checkpoints: per-stage shard files plus a small manifest, in one folder.
//
//   <dir>/stage-003.part-0-of-1.bin   one shard: named tensors (parameters, optimizer state)
//   <dir>/manifest.json               model, plan, step, data position, optimizer, and every
//                                     shard's file name, size and checksum
//
// Atomicity: every file is written to a temporary name, fsynced and renamed
// (WriteFileAtomically). The manifest is written last, after all shards, and records their
// checksums, so a crash at any point leaves either no manifest, the previous complete
// checkpoint, or a manifest whose shards fail the checksum — never a half checkpoint that
// loads. Writers remove an old manifest before writing new shards (RemoveManifest).
//
// Errors on load: NotFound for a missing manifest or shard (naming the file), DataLoss for a
// shard whose size or checksum differs from the manifest, whose contents are malformed or
// whose tensors hold a NaN or an infinity, InvalidArgument for a malformed manifest (naming
// the field) or a checkpoint file that is not a regular file (a FIFO, a device),
// ResourceExhausted for a manifest or `latest` beyond its size limit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/communicator.h"
#include "nlohmann/json.hpp"

namespace tandem::runtime {

inline constexpr int kCheckpointFormatVersion = 1;
// Largest step a manifest may hold (2^40: far beyond any run, far below overflow).
inline constexpr int64_t kMaxCheckpointStep = int64_t{1} << 40;
inline constexpr char kManifestFileName[] = "manifest.json";
// Checkpoint files are read only when they are regular files (never a FIFO or a device, which
// would hang or never end), of at most these sizes: a manifest (shard list, plan, data
// position) and the `latest` pointer of a checkpoint root (one step folder name).
inline constexpr int64_t kMaxManifestBytes = int64_t{64} << 20;
inline constexpr int64_t kMaxLatestBytes = 4096;

// When a training run saves (plain and elastic alike): after iteration `done` (counted from 1)
// when it is a multiple of `every` (> 0), and after the run's last iteration `end`.
inline bool CheckpointDue(int64_t done, int64_t end, int every) {
  return (every > 0 && done % every == 0) || done == end;
}

// One named tensor of a shard, as raw bytes.
struct ShardTensor {
  std::string name;
  comm::DataType dtype = comm::DataType::kFloat32;
  int64_t count = 0;   // elements
  // Dimensions, row-major; their product is `count`. Every shard written since shapes were
  // recorded holds one for every tensor ([count] where the stage did not know the shape); empty
  // only for a tensor of an older shard.
  std::vector<int64_t> shape;
  std::string bytes;   // count * SizeOf(dtype) bytes

  bool operator==(const ShardTensor& o) const {
    return name == o.name && dtype == o.dtype && count == o.count && shape == o.shape &&
           bytes == o.bytes;
  }
};

// "[4096, 512]" ("[]" for none recorded).
std::string ShapeString(const std::vector<int64_t>& shape);
// The product of the dimensions (1 for []).
int64_t ShapeElements(const std::vector<int64_t>& shape);
// Whether a recorded shape `saved` fits a tensor of shape `wanted`: equal, or either is
// unknown (empty), or `saved` is flat ([count]: written by a stage that did not know the shape)
// with the same element count.
bool ShapesCompatible(const std::vector<int64_t>& saved, const std::vector<int64_t>& wanted);

// The state of one stage (or one part of it when the optimizer state is sharded over the
// stage's gradient group): parameters and optimizer state as named tensors, plus free-form
// metadata (e.g. the optimizer's step count).
struct CheckpointShard {
  int stage = 0;
  int part = 0;        // 0 .. num_parts-1
  int num_parts = 1;
  std::vector<ShardTensor> tensors;
  nlohmann::json metadata = nlohmann::json::object();

  const ShardTensor* Find(absl::string_view name) const;
};

// What the manifest says about a shard file.
struct ShardRecord {
  int stage = 0;
  int part = 0;
  int num_parts = 1;
  std::string file;     // relative to the checkpoint folder
  int64_t bytes = 0;
  std::string checksum; // 16 hex digits (FNV-1a 64 of the whole file)

  bool operator==(const ShardRecord& o) const {
    return stage == o.stage && part == o.part && num_parts == o.num_parts && file == o.file &&
           bytes == o.bytes && checksum == o.checksum;
  }
};

struct CheckpointManifest {
  int format_version = kCheckpointFormatVersion;
  std::string model;           // the model description; must match on load
  nlohmann::json plan;         // the plan the checkpoint was written under
  int64_t step = 0;            // iterations completed: training resumes at this iteration
  nlohmann::json data_position = nlohmann::json::object();  // e.g. {"next_iteration": 10}
  nlohmann::json optimizer = nlohmann::json::object();      // optimizer configuration
  // What the run that wrote it trained on, for a resume to check (the front end's record: data
  // set identity, learning-rate schedule, global batch); empty when none was given.
  nlohmann::json run = nlohmann::json::object();
  std::vector<ShardRecord> shards;

  const ShardRecord* FindShard(int stage, int part) const;
};

// File name of a shard: "stage-003.part-0-of-1.bin".
std::string ShardFileName(int stage, int part, int num_parts);

// FNV-1a 64-bit checksum as 16 hex digits.
std::string Checksum(absl::string_view bytes);

// Serialises a shard (magic, JSON header, raw tensor bytes) and parses it back. The header
// lists each tensor's name, dtype, element count and shape; a shard without shapes (written
// before they were recorded) parses with empty shapes. Parse errors are DataLoss naming
// `source` (a shape whose product is not the element count among them).
std::string SerializeShard(const CheckpointShard& shard);
absl::StatusOr<CheckpointShard> ParseShard(absl::string_view data, absl::string_view source);

// Writes a shard atomically into `dir` and returns its record for the manifest.
absl::StatusOr<ShardRecord> WriteShard(const std::string& dir, const CheckpointShard& shard);
// Reads the shard the record names, checking size and checksum first.
absl::StatusOr<CheckpointShard> ReadShard(const std::string& dir, const ShardRecord& record);

nlohmann::json ToJson(const CheckpointManifest& manifest);
absl::StatusOr<CheckpointManifest> ManifestFromJson(const nlohmann::json& j,
                                                    absl::string_view source);
// Creates `dir` (and parents) if needed.
absl::Status EnsureDirectory(const std::string& dir);
// Writes <dir>/manifest.json atomically.
absl::Status WriteManifest(const std::string& dir, const CheckpointManifest& manifest);
// Reads and checks <dir>/manifest.json, including that every shard file exists with the
// recorded size (checksums are checked when a shard is read).
absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& dir);
// Removes <dir>/manifest.json if present (before overwriting a checkpoint in place).
absl::Status RemoveManifest(const std::string& dir);

// Checkpoint folders. A checkpoint root holds one folder per saved step (step-00000012/, each
// a complete checkpoint: shards and manifest) and a file `latest` naming the newest complete
// one. A save writes a hidden partial folder, renames it to its step's name once its manifest
// is written, and only then replaces `latest` (atomically): a crash at any moment leaves the
// previous checkpoint loadable.
inline constexpr char kLatestFileName[] = "latest";
std::string StepFolderName(int64_t step);
// A partial folder of a save in progress (hidden; removed by CleanCheckpointLeftovers).
std::string PartialFolderName(int64_t step);

// The folder to load from `root`: the step folder `latest` names or, when `root` has no
// `latest`, `root` itself (a step folder given directly, or a folder in the older flat
// layout); reading its manifest then tells whether it holds a checkpoint.
absl::StatusOr<std::string> ResolveCheckpoint(const std::string& root);

// Removes what interrupted saves left in `root`: partial folders and temporary files.
absl::Status CleanCheckpointLeftovers(const std::string& root);

// Publishes the complete folder `partial` as step `step` of `root`: renamed to its step's
// name (replacing an older save of the same step), then `latest` switched to it, then all but
// the newest `keep` step folders removed (keep <= 0: none removed).
absl::Status PublishCheckpoint(const std::string& root, const std::string& partial,
                               int64_t step, int keep);

}  // namespace tandem::runtime
