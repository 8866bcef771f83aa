// Every parameter of a tandem checkpoint by name, for tests that compare a checkpoint with what
// another tool wrote or read (a root with `latest`, or a step folder). Failures are test
// failures; what could be read is returned.
#pragma once

#include <map>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint.h"

namespace tandem::testing {

inline std::map<std::string, runtime::ShardTensor> CheckpointParameters(const std::string& root) {
  std::map<std::string, runtime::ShardTensor> out;
  auto folder = runtime::ResolveCheckpoint(root);
  EXPECT_TRUE(folder.ok()) << folder.status();
  if (!folder.ok()) return out;
  auto manifest = runtime::ReadManifest(*folder);
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  if (!manifest.ok()) return out;
  for (const runtime::ShardRecord& record : manifest->shards) {
    auto shard = runtime::ReadShard(*folder, record);
    EXPECT_TRUE(shard.ok()) << shard.status();
    if (!shard.ok()) continue;
    for (runtime::ShardTensor& t : shard->tensors) {
      if (absl::StartsWith(t.name, "param:")) out[t.name.substr(6)] = std::move(t);
    }
  }
  return out;
}

}  // namespace tandem::testing
