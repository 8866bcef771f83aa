// Token shards (data/: llm.c, nanoGPT and Megatron-LM files, memory-mapped) as a training data
// set for the runtime: sample j of the global batch of iteration i is the window that the
// shuffled order of data/sample_order.h puts at position (i mod S) * G + j of epoch i / S
// (G the global batch, S = floor(windows / G) steps per epoch; each epoch a new order from
// (seed, epoch)). A pure function of (seed, iteration, sample) as the batch rule
// (runtime/torch/data.h) wants, so every rank reads exactly the samples it needs, each
// data-parallel replica its own part of each global batch, and a resumed run (on any world
// size or data-parallel degree) reads the batches an uninterrupted run would.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/sample_windows.h"
#include "data/token_dataset.h"
#include "runtime/torch/data.h"

namespace tandem::runtime::libtorch {

struct TokenShardOptions {
  // Token files, folders of them or glob patterns (data/token_dataset.h).
  std::vector<std::string> sources;
  data::TokenFileFormat format = data::TokenFileFormat::kAuto;
  int64_t seq_len = 0;
  // Every token must be below it: the whole data set is checked when it is opened (a streaming
  // scan of the mappings, about a second per gigatoken), so a bad token is refused before the
  // first step, naming its file and offset.
  int64_t vocab = 0;
  uint64_t seed = 0;
  // Windows inside documents only (Megatron-LM shards); attention across documents is not
  // masked either way yet.
  bool within_documents = false;
  // false: data-set order every epoch (evaluation).
  bool shuffle = true;
};

// InvalidArgument / NotFound / DataLoss name the file (data/token_dataset.h's errors), a token
// outside the vocabulary, a shard shorter than one window.
absl::StatusOr<std::shared_ptr<Dataset>> MakeTokenShardDataset(const TokenShardOptions& options);

// The vocabulary size recorded beside token shards (a `dataset.json` with "vocab_size" in the
// folder of the first source, as scripts/prepare_data.py writes it); 0 when there is none.
// InvalidArgument for a malformed dataset.json.
absl::StatusOr<int64_t> RecordedVocabularySize(const std::vector<std::string>& sources);

// The shards of split `split` ("train", "valid") of the folders among `sources` that
// scripts/prepare_data.py wrote (a dataset.json listing each split's shards); other sources
// unchanged. NotFound when such a folder has no shard of that split; InvalidArgument for a
// malformed dataset.json.
absl::StatusOr<std::vector<std::string>> PreparedSplitShards(
    const std::vector<std::string>& sources, const std::string& split);

// Whether `source` names token shards rather than a text file: a folder, a glob pattern, or a
// file ending in .bin.
bool LooksLikeTokenShards(const std::string& source);

}  // namespace tandem::runtime::libtorch
