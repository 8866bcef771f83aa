// One opened token shard: its mappings, where its tokens start, its Megatron index. The
// formats and the checks made when a shard is opened are described in data/token_dataset.h.
//
// Thread safety: immutable once opened.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "data/dataset_identity.h"
#include "common/mapped_file.h"
#include "data/token_dataset.h"

namespace tandem::data::internal {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "token shards are little-endian and read in place: a big-endian build would "
              "need byte swaps here");

inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int64_t kLlmcHeaderBytes = 256 * 4;
inline constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
// magic, version uint64, dtype code uint8, sequence count uint64, document-index count uint64
inline constexpr int64_t kMegatronIndexHeaderBytes = 9 + 8 + 1 + 8 + 8;

// A little-endian value of type T at `bytes` (any alignment).
template <typename T>
T LoadLittleEndian(const uint8_t* bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof(T));
  return value;
}

class TokenShard {
 public:
  // Opens the shard whose token file is `path`, in `format` (kAuto: detected). Errors as in
  // data/token_dataset.h, each naming the file.
  static absl::StatusOr<std::unique_ptr<TokenShard>> Open(const std::string& path,
                                                          TokenFileFormat format);

  const std::string& path() const { return path_; }
  const std::string& index_path() const { return index_path_; }
  TokenFileFormat format() const { return format_; }
  TokenType token_type() const { return token_type_; }
  int token_bytes() const { return TokenTypeBytes(token_type_); }
  int64_t num_tokens() const { return num_tokens_; }
  // Megatron documents (D - 1); 0 without an index.
  int64_t num_documents() const {
    return document_index_entries_ > 0 ? document_index_entries_ - 1 : 0;
  }
  const ShardIdentity& identity() const { return identity_; }

  // Tokens [first, first + count) of this shard (local indices, in range) into `out`.
  void CopyTokens(int64_t first, int64_t count, int64_t* out) const;
  // The token at local index `index`.
  int64_t TokenAt(int64_t index) const;
  // Local tokens [begin, end) of document `document` (0 <= document < num_documents()).
  std::pair<int64_t, int64_t> DocumentTokens(int64_t document) const;
  // The first local index in [first, first + count) whose token lies outside
  // [0, vocabulary_size), or -1. Streams through the mapping.
  int64_t FindTokenOutsideVocabulary(int64_t first, int64_t count, int64_t vocabulary_size) const;
  // Hints that the whole shard will be read in order (a vocabulary scan), and back.
  void AdviseSequential() const;
  void AdviseNormal() const;

 private:
  TokenShard() = default;
  absl::Status OpenLlmc();
  absl::Status OpenNanoGpt();
  absl::Status OpenMegatron();
  void ComputeIdentity();
  // Global byte offset in the .bin of sequence `sequence` (S: the end of the data).
  int64_t SequenceByteOffset(int64_t sequence) const;

  std::string path_;
  std::string index_path_;
  TokenFileFormat format_ = TokenFileFormat::kNanoGpt;
  TokenType token_type_ = TokenType::kUint16;
  std::unique_ptr<MappedFile> token_file_;
  std::unique_ptr<MappedFile> index_file_;
  const uint8_t* tokens_ = nullptr;  // first token's bytes in token_file_
  int64_t num_tokens_ = 0;
  int64_t header_bytes_ = 0;  // bytes before the first token (llm.c: 1024)

  // Megatron index, read in place from index_file_.
  int64_t num_sequences_ = 0;
  int64_t document_index_entries_ = 0;
  const uint8_t* sequence_offsets_ = nullptr;  // int64[num_sequences_]
  const uint8_t* document_indices_ = nullptr;  // int64[document_index_entries_]

  ShardIdentity identity_;
};

}  // namespace tandem::data::internal
