// Token shards: tokenized training corpora, memory-mapped read-only and read a window at a
// time, never whole.
//
// Formats (one shard is one file; for Megatron, one prefix.bin with its prefix.idx):
//   * llm.c (kLlmc): a header of 256 little-endian int32, [0] = magic 20240520, [1] = version
//     (1: uint16 tokens; 2: uint32 tokens, as llm.c writes for Llama 3), [2] = token count,
//     then exactly that many tokens.
//   * nanoGPT (kNanoGpt): headerless little-endian uint16 tokens, as its prepare.py writes
//     them (np.array(ids, dtype=np.uint16).tofile(path)).
//   * Megatron-LM's indexed dataset (kMegatron): prefix.bin holds the tokens; prefix.idx holds
//     "MMIDIDX\0\0", version uint64 1, the token dtype code uint8, the sequence count S uint64,
//     the document-index count D uint64, then int32 sequence lengths[S], int64 sequence byte
//     offsets[S] and int64 document indices[D] (the sequence at which each document starts,
//     0 first and S last, so D - 1 documents), optionally followed by S int8 sequence modes
//     (multimodal data sets; ignored). Token dtypes: uint16 (code 8) and int32 (code 4); the
//     others (uint8, int8, int16, int64, float64, float32) are refused naming the dtype. The
//     sequences must be stored back to back in the .bin, which must hold exactly them (what
//     Megatron's builder writes, merges included).
//   All multi-byte values are little-endian; tandem builds only for little-endian machines.
//
// Detection (kAuto): a token file `prefix.bin` with a `prefix.idx` beside it is Megatron;
// otherwise a file whose first int32 is llm.c's magic is llm.c; anything else is headerless
// uint16 (nanoGPT). A nanoGPT file whose first two tokens happen to be 55432, 308 (the magic's
// halves) is taken for llm.c and then refused for its header: force the format for it.
//
// A data set is the concatenation of its shards' tokens in data-set order: global token offset
// 0 is the first shard's first token. Random access (ReadTokens) may cross shard boundaries;
// the sample windows built on a data set (data/sample_windows.h) never do.
//
// Errors, each naming the file and what is wrong: NotFound (no such file; a folder without
// .bin files; a pattern matching nothing), ResourceExhausted (a file that cannot be mapped),
// InvalidArgument (not a regular file, bad magic,
// unsupported version or dtype, a source listed twice, a token outside the vocabulary),
// DataLoss (truncated shard: a header or index that promises more than the file holds, a size
// that is not a whole number of tokens, sequence offsets or lengths outside the .bin, counts
// that disagree with the file sizes, document indices out of order). A malformed file never
// crashes the reader: it is refused when opened.
//
// Files must not change while a data set is open: they are memory-mapped (as numpy's memmap
// in nanoGPT and Megatron-LM), and a file truncated underneath is a SIGBUS on the next read.
//
// A TokenDataset is a handle: copies are cheap and share the same immutable mappings, which
// are unmapped when the last copy goes (SampleWindows keeps one). A moved-from handle may only
// be assigned to or destroyed.
//
// Thread safety: immutable once opened; every method may be called from any number of threads
// at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "data/dataset_identity.h"

namespace tandem::data {

enum class TokenFileFormat { kAuto, kLlmc, kNanoGpt, kMegatron };
// "auto", "llm.c", "nanogpt", "megatron"; Parse also accepts "llmc".
absl::string_view TokenFileFormatName(TokenFileFormat format);
absl::StatusOr<TokenFileFormat> ParseTokenFileFormat(absl::string_view name);

enum class TokenType { kUint16, kUint32, kInt32 };
absl::string_view TokenTypeName(TokenType type);  // "uint16", "uint32", "int32"
int TokenTypeBytes(TokenType type);

// Tokens [begin, end) as global offsets of a data set.
struct TokenRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const TokenRange& other) const {
    return begin == other.begin && end == other.end;
  }
};

struct TokenDatasetOptions {
  // kAuto detects each shard's format (see above); any other value forces it for every shard.
  TokenFileFormat format = TokenFileFormat::kAuto;
};

// What one shard is, once opened.
struct TokenShardInfo {
  std::string path;        // the token file (Megatron: prefix.bin)
  std::string index_path;  // Megatron: prefix.idx; empty for the other formats
  TokenFileFormat format = TokenFileFormat::kNanoGpt;  // detected or forced; never kAuto
  TokenType token_type = TokenType::kUint16;
  int64_t first_token = 0;  // global offset of the shard's first token
  int64_t num_tokens = 0;
  int64_t num_documents = 0;  // Megatron documents; 0 for formats without a document index

  TokenRange tokens() const { return {first_token, first_token + num_tokens}; }
};

class TokenDataset {
 public:
  // Opens the shards named by `sources`, each of which is
  //   * a token file (a Megatron `prefix.idx` stands for its prefix.bin);
  //   * a Megatron prefix without extension (prefix.bin and prefix.idx exist);
  //   * a folder: its `*.bin` files, in sorted file-name order (byte order: name shards
  //     with zero-padded numbers, as llm.c and Megatron do);
  //   * a glob pattern (`*`, `?`, `[`): the files it matches, in sorted order, less `.idx`
  //     files (each comes with its .bin).
  // The sources keep the order given. A file named twice is InvalidArgument; so is an empty
  // list.
  static absl::StatusOr<TokenDataset> Open(const std::vector<std::string>& sources,
                                           const TokenDatasetOptions& options = {});
  static absl::StatusOr<TokenDataset> Open(const std::string& source,
                                           const TokenDatasetOptions& options = {});

  int64_t num_tokens() const;
  int num_shards() const;
  const TokenShardInfo& shard(int index) const;
  // The shard holding global token `offset`, 0 <= offset < num_tokens().
  int ShardOf(int64_t offset) const;

  // Copies tokens [offset, offset + out.size()) into `out`, widened to int64, across shard
  // boundaries as needed: a convert loop from the mapping. OutOfRange when the range is not
  // inside [0, num_tokens()). With `vocabulary_size` > 0, a token outside
  // [0, vocabulary_size) is InvalidArgument naming its file, its index in that file and its
  // value (`out` then holds what was read).
  absl::Status ReadTokens(int64_t offset, absl::Span<int64_t> out,
                          int64_t vocabulary_size = 0) const;

  // The global tokens of document `document` of shard `shard_index`
  // (0 <= document < shard(shard_index).num_documents).
  TokenRange DocumentTokens(int shard_index, int64_t document) const;

  // Streams through every shard's mapping once: OK when every token id lies in
  // [0, vocabulary_size); otherwise InvalidArgument naming the first offending file, the
  // token's index in that file, its global offset and its value.
  absl::Status CheckVocabulary(int64_t vocabulary_size) const;

  const DatasetIdentity& identity() const;

 private:
  struct State;  // the shards and their mappings (token_dataset.cc)
  explicit TokenDataset(std::shared_ptr<const State> state) : state_(std::move(state)) {}

  std::shared_ptr<const State> state_;
};

}  // namespace tandem::data
