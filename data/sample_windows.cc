#include "data/sample_windows.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::data {

int64_t SampleWindows::AddPiece(const TokenRange& range) {
  const int64_t length = options_.sequence_length;
  const int64_t windows = range.size() > length ? (range.size() - 1) / length : 0;
  unread_tokens_ += windows > 0 ? range.size() - (windows * length + 1) : range.size();
  if (windows > 0) {
    piece_starts_.push_back(range.begin);
    cumulative_samples_.push_back(num_samples() + windows);
  }
  return windows;
}

absl::StatusOr<SampleWindows> SampleWindows::Create(const TokenDataset& dataset,
                                                    const SampleWindowOptions& options) {
  if (options.sequence_length < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence length must be at least 1, got ", options.sequence_length));
  }
  if (options.vocabulary_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocabulary size must be positive (or 0: unchecked), got ", options.vocabulary_size));
  }
  const int64_t window = options.sequence_length + 1;
  SampleWindows windows(dataset, options);
  for (int s = 0; s < dataset.num_shards(); ++s) {
    const TokenShardInfo& shard = dataset.shard(s);
    if (options.layout == WindowLayout::kContiguous) {
      if (shard.num_tokens < window) {
        return absl::InvalidArgumentError(
            absl::StrCat(shard.path, ": the shard holds ", shard.num_tokens,
                         " tokens, fewer than one sample needs (sequence length ",
                         options.sequence_length, " + 1 = ", window, ")"));
      }
      windows.AddPiece(shard.tokens());
      continue;
    }
    if (shard.format != TokenFileFormat::kMegatron) {
      return absl::InvalidArgumentError(
          absl::StrCat(shard.path,
                       ": windows within documents need a document index (a Megatron .idx); "
                       "this shard is ",
                       TokenFileFormatName(shard.format)));
    }
    for (int64_t d = 0; d < shard.num_documents; ++d) {
      windows.AddPiece(dataset.DocumentTokens(s, d));
    }
  }
  if (windows.num_samples() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("no document of the data set holds one sample (sequence length ",
                     options.sequence_length, " + 1 = ", window, " tokens)"));
  }
  return windows;
}

TokenRange SampleWindows::Window(int64_t sample) const {
  const size_t piece = static_cast<size_t>(
      std::upper_bound(cumulative_samples_.begin(), cumulative_samples_.end(), sample) -
      cumulative_samples_.begin());
  const int64_t first_sample_of_piece = piece == 0 ? 0 : cumulative_samples_[piece - 1];
  const int64_t begin =
      piece_starts_[piece] + (sample - first_sample_of_piece) * options_.sequence_length;
  return {begin, begin + options_.sequence_length + 1};
}

absl::Status SampleWindows::FetchSample(int64_t sample, absl::Span<int64_t> inputs,
                                        absl::Span<int64_t> targets) const {
  if (sample < 0 || sample >= num_samples()) {
    return absl::OutOfRangeError(
        absl::StrCat("sample ", sample, " is outside [0, ", num_samples(), ")"));
  }
  const int64_t length = options_.sequence_length;
  if (static_cast<int64_t>(inputs.size()) != length ||
      static_cast<int64_t>(targets.size()) != length) {
    return absl::InvalidArgumentError(absl::StrCat("sample buffers hold ", inputs.size(),
                                                   " inputs and ", targets.size(),
                                                   " targets; the sequence length is ", length));
  }
  const TokenRange window = Window(sample);
  // Two convert loops from the mapping (the second reads the cache lines the first brought
  // in); both stay within one shard, since windows never cross one.
  const absl::Status status = dataset_.ReadTokens(window.begin, inputs, options_.vocabulary_size);
  if (!status.ok()) return status;
  return dataset_.ReadTokens(window.begin + 1, targets, options_.vocabulary_size);
}

}  // namespace tandem::data
