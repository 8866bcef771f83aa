// The identity of a token data set, saved with a checkpoint so that a resumed run can check it
// reads the same data: for each shard, in data-set order, its file name, size, token count and
// a cheap checksum.
//
// The checksum (64-bit FNV-1a) covers what is cheap to read yet changes when the data does:
//   * the shard's format header: llm.c's 1024-byte header; Megatron's whole .idx file (its
//     sequence lengths and document boundaries, read anyway when the shard is opened);
//     nothing for headerless nanoGPT files;
//   * the first and the last 64 KiB of the token bytes (all of them in a smaller shard);
//   * the byte sizes of the token file and of the .idx.
// It does not read every token: two shards equal in size, header and both ends but differing
// in the middle compare equal. The file name is the name without its folder, so that a data
// set copied to another machine or mount point keeps its identity.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tandem::data {

struct ShardIdentity {
  std::string name;        // file name of the token file, without its folder
  int64_t size_bytes = 0;  // token file plus, for Megatron, its .idx
  int64_t num_tokens = 0;
  uint64_t checksum = 0;

  bool operator==(const ShardIdentity& other) const;
  bool operator!=(const ShardIdentity& other) const { return !(*this == other); }
};

struct DatasetIdentity {
  std::vector<ShardIdentity> shards;  // in data-set order

  int64_t num_tokens() const;
  bool operator==(const DatasetIdentity& other) const { return shards == other.shards; }
  bool operator!=(const DatasetIdentity& other) const { return !(*this == other); }

  // One line: "2 shards, 2048 tokens: a.bin 4096 bytes 1024 tokens checksum 0f1e...; ...".
  std::string ToString() const;
  // {"shards": [{"name": "a.bin", "size_bytes": 4096, "num_tokens": 1024,
  //              "checksum": "0f1e2d3c4b5a6978"}]}; the checksum is 16 hex digits (a JSON
  // number would lose bits past 2^53 in many readers).
  nlohmann::json ToJson() const;
  // The inverse of ToJson. InvalidArgument names `where` and the field.
  static absl::StatusOr<DatasetIdentity> FromJson(const nlohmann::json& json,
                                                  absl::string_view where);
};

// OK when `current` is `saved`; otherwise FailedPrecondition naming the first difference (shard
// count, or a shard's name, size, token count or checksum), for a resume that must read the
// data its checkpoint was trained on.
absl::Status CheckSameDataset(const DatasetIdentity& saved, const DatasetIdentity& current);

}  // namespace tandem::data
