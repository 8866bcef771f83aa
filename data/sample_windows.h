// Samples of a token data set: sample i is a window of sequence_length + 1 consecutive tokens,
// whose first sequence_length tokens are the model's inputs and whose last sequence_length
// are its targets (the inputs shifted by one).
//
// Windows never cross a shard boundary (as in llm.c, which reads one shard at a time, and
// Megatron-LM, whose every prefix is a data set of its own). Two layouts:
//   * kContiguous: each shard, in data-set order, is cut into windows that start every
//     sequence_length tokens: window j of a shard covers its tokens
//     [j * sequence_length, j * sequence_length + sequence_length + 1), so consecutive windows
//     share one token (the last target of one is the first input of the next). The tail of a
//     shard too short for another window is not read. A window may span several documents:
//     attention across document boundaries is NOT masked (nor are positions reset) yet; the
//     model sees the end-of-text token between them, as in nanoGPT and llm.c.
//   * kWithinDocuments: the same cut applied to each document of a Megatron shard, so no window
//     crosses a document boundary; documents shorter than sequence_length + 1 tokens give no
//     sample. Needs a document index: shards without one (llm.c, nanoGPT) are refused.
//     Memory: 16 bytes per document that gives at least one sample.
// Samples are numbered in data-set order: shard by shard (document by document), window by
// window. data/sample_order.h decides which samples a step reads.
//
// Thread safety: immutable once built; FetchSample may be called from any number of threads at
// once (each with its own buffers). It keeps a handle on the data set (its mappings stay).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "data/token_dataset.h"

namespace tandem::data {

enum class WindowLayout { kContiguous, kWithinDocuments };

struct SampleWindowOptions {
  int64_t sequence_length = 1024;  // input tokens per sample; a window holds one more
  WindowLayout layout = WindowLayout::kContiguous;
  // > 0: every fetched token is checked against it (the lazy form of
  // TokenDataset::CheckVocabulary); 0: not checked.
  int64_t vocabulary_size = 0;
};

class SampleWindows {
 public:
  // InvalidArgument for a sequence length below 1, for a shard (kContiguous) shorter than one
  // window (sequence_length + 1 tokens; naming the file and both counts), for a shard without
  // a document index (kWithinDocuments), and when no document holds a window.
  static absl::StatusOr<SampleWindows> Create(const TokenDataset& dataset,
                                              const SampleWindowOptions& options);

  int64_t num_samples() const {
    return cumulative_samples_.empty() ? 0 : cumulative_samples_.back();
  }
  int64_t sequence_length() const { return options_.sequence_length; }
  const SampleWindowOptions& options() const { return options_; }
  // Tokens that no window reads (the tails of shards or documents, short documents).
  int64_t unread_tokens() const { return unread_tokens_; }

  // The global tokens of sample `sample`'s window (0 <= sample < num_samples()).
  TokenRange Window(int64_t sample) const;

  // Writes sample `sample`'s inputs (window[0, L)) and targets (window[1, L + 1)), L the
  // sequence length, widened to int64. OutOfRange for a sample outside [0, num_samples());
  // InvalidArgument when a buffer's size is not L, or (with a vocabulary size) for a token
  // outside the vocabulary, naming its file and position.
  absl::Status FetchSample(int64_t sample, absl::Span<int64_t> inputs,
                           absl::Span<int64_t> targets) const;

 private:
  SampleWindows(const TokenDataset& dataset, const SampleWindowOptions& options)
      : dataset_(dataset), options_(options) {}
  // Adds a piece (a shard or a document) of `range`; returns the windows it gives.
  int64_t AddPiece(const TokenRange& range);

  TokenDataset dataset_;  // a handle sharing the caller's mappings
  SampleWindowOptions options_;
  // For each piece that gives windows: where it starts, and the samples before its end.
  std::vector<int64_t> piece_starts_;
  std::vector<int64_t> cumulative_samples_;
  int64_t unread_tokens_ = 0;
};

}  // namespace tandem::data
