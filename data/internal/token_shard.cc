#include "data/internal/token_shard.h"

#include <sys/stat.h>

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::data::internal {
namespace {

constexpr int64_t kChecksumEdgeBytes = 64 * 1024;

// 64-bit FNV-1a, fed in pieces.
class Fnv1a64 {
 public:
  void Add(const uint8_t* bytes, int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      hash_ = (hash_ ^ bytes[i]) * 0x100000001b3ULL;
    }
  }
  void AddInt64(int64_t value) {
    uint8_t bytes[8];
    std::memcpy(bytes, &value, sizeof(bytes));
    Add(bytes, sizeof(bytes));
  }
  uint64_t hash() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ULL;
};

bool PathExists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Megatron's dtype codes (megatron/core/datasets/indexed_dataset.py, DType).
absl::string_view MegatronDtypeName(int code) {
  switch (code) {
    case 1:
      return "uint8";
    case 2:
      return "int8";
    case 3:
      return "int16";
    case 4:
      return "int32";
    case 5:
      return "int64";
    case 6:
      return "float64";
    case 7:
      return "float32";
    case 8:
      return "uint16";
    default:
      return "unknown";
  }
}

template <typename T>
void Convert(const uint8_t* bytes, int64_t count, int64_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    out[i] = static_cast<int64_t>(LoadLittleEndian<T>(bytes + i * static_cast<int64_t>(sizeof(T))));
  }
}

template <typename T>
int64_t FindOutside(const uint8_t* bytes, int64_t count, int64_t vocabulary_size) {
  // Blocks of branch-free minimum and maximum, so that the common case (no bad token) runs
  // at memory speed; a block that fails is searched again for the first bad index.
  constexpr int64_t kBlock = 4096;
  for (int64_t start = 0; start < count; start += kBlock) {
    const int64_t end = std::min(count, start + kBlock);
    int64_t lowest = 0;
    int64_t highest = 0;
    for (int64_t i = start; i < end; ++i) {
      const int64_t token = LoadLittleEndian<T>(bytes + i * static_cast<int64_t>(sizeof(T)));
      lowest = std::min(lowest, token);
      highest = std::max(highest, token);
    }
    if (lowest >= 0 && highest < vocabulary_size) continue;
    for (int64_t i = start; i < end; ++i) {
      const int64_t token = LoadLittleEndian<T>(bytes + i * static_cast<int64_t>(sizeof(T)));
      if (token < 0 || token >= vocabulary_size) return i;
    }
  }
  return -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenShard>> TokenShard::Open(const std::string& path,
                                                             TokenFileFormat format) {
  std::unique_ptr<TokenShard> shard(new TokenShard());
  shard->path_ = path;
  const bool ends_in_bin = absl::EndsWith(path, ".bin");
  const std::string index_path = ends_in_bin ? path.substr(0, path.size() - 4) + ".idx" : "";
  if (format == TokenFileFormat::kAuto && ends_in_bin && PathExists(index_path)) {
    format = TokenFileFormat::kMegatron;
  }
  if (format == TokenFileFormat::kMegatron) {
    if (!ends_in_bin) {
      return absl::InvalidArgumentError(
          absl::StrCat(path,
                       ": a Megatron shard is prefix.bin beside prefix.idx; this name does not end "
                       "in .bin"));
    }
    shard->index_path_ = index_path;
  }
  TANDEM_ASSIGN_OR_RETURN(shard->token_file_, MappedFile::Open(path));
  if (format == TokenFileFormat::kAuto) {
    const MappedFile& file = *shard->token_file_;
    format = file.size_bytes() >= 4 && LoadLittleEndian<int32_t>(file.data()) == kLlmcMagic
                 ? TokenFileFormat::kLlmc
                 : TokenFileFormat::kNanoGpt;
  }
  shard->format_ = format;
  switch (format) {
    case TokenFileFormat::kLlmc:
      TANDEM_RETURN_IF_ERROR(shard->OpenLlmc());
      break;
    case TokenFileFormat::kNanoGpt:
      TANDEM_RETURN_IF_ERROR(shard->OpenNanoGpt());
      break;
    case TokenFileFormat::kMegatron:
      TANDEM_RETURN_IF_ERROR(shard->OpenMegatron());
      break;
    case TokenFileFormat::kAuto:
      break;  // resolved above
  }
  shard->ComputeIdentity();
  return shard;
}

absl::Status TokenShard::OpenLlmc() {
  const int64_t size = token_file_->size_bytes();
  const uint8_t* bytes = token_file_->data();
  if (size < 4) {
    return absl::DataLossError(absl::StrCat(path_, ": truncated llm.c header: the file holds ",
                                            size, " bytes, the header alone is ",
                                            kLlmcHeaderBytes));
  }
  const int32_t magic = LoadLittleEndian<int32_t>(bytes);
  if (magic != kLlmcMagic) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": bad magic ", magic, " for an llm.c token file (expected ", kLlmcMagic, ")"));
  }
  if (size < kLlmcHeaderBytes) {
    return absl::DataLossError(absl::StrCat(path_, ": truncated llm.c header: the file holds ",
                                            size, " bytes, the header alone is ",
                                            kLlmcHeaderBytes));
  }
  const int32_t version = LoadLittleEndian<int32_t>(bytes + 4);
  if (version == 1) {
    token_type_ = TokenType::kUint16;
  } else if (version == 2) {
    token_type_ = TokenType::kUint32;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": unsupported llm.c version ", version,
                     " (supported: 1, uint16 tokens; 2, uint32 tokens)"));
  }
  const int32_t count = LoadLittleEndian<int32_t>(bytes + 8);
  if (count < 0) {
    return absl::DataLossError(
        absl::StrCat(path_, ": llm.c header gives a negative token count ", count));
  }
  const int64_t expected = kLlmcHeaderBytes + static_cast<int64_t>(count) * token_bytes();
  if (size != expected) {
    return absl::DataLossError(absl::StrCat(path_, ": the llm.c header promises ", count, " ",
                                            TokenTypeName(token_type_), " tokens (", expected,
                                            " bytes with the header) but the file holds ", size,
                                            " bytes", size < expected ? " (truncated)" : ""));
  }
  header_bytes_ = kLlmcHeaderBytes;
  tokens_ = bytes + kLlmcHeaderBytes;
  num_tokens_ = count;
  return absl::OkStatus();
}

absl::Status TokenShard::OpenNanoGpt() {
  token_type_ = TokenType::kUint16;
  const int64_t size = token_file_->size_bytes();
  if (size % 2 != 0) {
    return absl::DataLossError(absl::StrCat(
        path_, ": ", size, " bytes is not a whole number of uint16 tokens (truncated?)"));
  }
  tokens_ = token_file_->data();
  num_tokens_ = size / 2;
  return absl::OkStatus();
}

absl::Status TokenShard::OpenMegatron() {
  TANDEM_ASSIGN_OR_RETURN(index_file_, MappedFile::Open(index_path_));
  const std::string& idx = index_path_;
  const int64_t index_size = index_file_->size_bytes();
  const uint8_t* index = index_file_->data();
  if (index_size < static_cast<int64_t>(sizeof(kMegatronMagic))) {
    return absl::DataLossError(absl::StrCat(idx, ": truncated Megatron index: ", index_size,
                                            " bytes, the header alone is ",
                                            kMegatronIndexHeaderBytes));
  }
  if (std::memcmp(index, kMegatronMagic, sizeof(kMegatronMagic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(idx, ": bad magic for a Megatron index (expected \"MMIDIDX\\0\\0\")"));
  }
  if (index_size < kMegatronIndexHeaderBytes) {
    return absl::DataLossError(absl::StrCat(idx, ": truncated Megatron index: ", index_size,
                                            " bytes, the header alone is ",
                                            kMegatronIndexHeaderBytes));
  }
  const uint64_t version = LoadLittleEndian<uint64_t>(index + 9);
  if (version != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(idx, ": unsupported Megatron index version ", version, " (expected 1)"));
  }
  const int dtype_code = index[17];
  if (dtype_code == 8) {
    token_type_ = TokenType::kUint16;
  } else if (dtype_code == 4) {
    token_type_ = TokenType::kInt32;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(idx, ": unsupported token dtype ", MegatronDtypeName(dtype_code), " (code ",
                     dtype_code, "); token shards must be uint16 (code 8) or int32 (code 4)"));
  }
  const uint64_t sequences = LoadLittleEndian<uint64_t>(index + 18);
  const uint64_t entries = LoadLittleEndian<uint64_t>(index + 26);
  // Sizes in unsigned arithmetic that cannot wrap: each count is first bounded by the file.
  const uint64_t body = static_cast<uint64_t>(index_size - kMegatronIndexHeaderBytes);
  const uint64_t expected =
      sequences <= body / 12 && entries <= body / 8 ? 12 * sequences + 8 * entries : ~0ULL;
  if (expected != body && (expected == ~0ULL || expected + sequences != body)) {
    return absl::DataLossError(absl::StrCat(idx, ": the index header counts ", sequences,
                                            " sequences and ", entries,
                                            " document indices, which do not fit its ", index_size,
                                            " bytes (truncated, or counts that are wrong)"));
  }
  if (entries == 0) {
    return absl::DataLossError(
        absl::StrCat(idx, ": no document indices (Megatron writes at least the leading 0)"));
  }
  num_sequences_ = static_cast<int64_t>(sequences);
  document_index_entries_ = static_cast<int64_t>(entries);
  const uint8_t* lengths = index + kMegatronIndexHeaderBytes;
  sequence_offsets_ = lengths + 4 * num_sequences_;
  document_indices_ = sequence_offsets_ + 8 * num_sequences_;

  const int64_t bin_size = token_file_->size_bytes();
  const int64_t bytes_per_token = token_bytes();
  int64_t running = 0;  // byte offset where the next sequence must start
  for (int64_t i = 0; i < num_sequences_; ++i) {
    const int32_t length = LoadLittleEndian<int32_t>(lengths + 4 * i);
    const int64_t offset = LoadLittleEndian<int64_t>(sequence_offsets_ + 8 * i);
    if (length < 0) {
      return absl::DataLossError(
          absl::StrCat(idx, ": sequence ", i, " has a negative length ", length));
    }
    if (offset != running) {
      return absl::DataLossError(absl::StrCat(idx, ": sequence ", i, " starts at byte ", offset,
                                              " of ", path_, ", expected ", running,
                                              " (sequences are stored back to back)"));
    }
    running += static_cast<int64_t>(length) * bytes_per_token;
    if (running > bin_size) {
      return absl::DataLossError(absl::StrCat(idx, ": sequence ", i, " (", length,
                                              " tokens from byte ", offset, ") ends past the ",
                                              bin_size, " bytes of ", path_, " (truncated .bin?)"));
    }
  }
  if (running != bin_size) {
    return absl::DataLossError(absl::StrCat(path_, ": holds ", bin_size, " bytes but its index ",
                                            idx, " describes ", running, " bytes of tokens"));
  }
  int64_t previous = 0;
  for (int64_t d = 0; d < document_index_entries_; ++d) {
    const int64_t sequence = LoadLittleEndian<int64_t>(document_indices_ + 8 * d);
    if ((d == 0 && sequence != 0) || sequence < previous || sequence > num_sequences_) {
      return absl::DataLossError(absl::StrCat(idx, ": document index ", d, " is sequence ",
                                              sequence, "; document indices must rise",
                                              " from 0 to the sequence count ", num_sequences_));
    }
    previous = sequence;
  }
  if (previous != num_sequences_) {
    return absl::DataLossError(absl::StrCat(idx, ": the last document index is sequence ", previous,
                                            ", not the sequence count ", num_sequences_,
                                            " (sequences outside any document)"));
  }
  tokens_ = token_file_->data();
  num_tokens_ = bin_size / bytes_per_token;
  return absl::OkStatus();
}

void TokenShard::ComputeIdentity() {
  Fnv1a64 checksum;
  checksum.Add(token_file_->data(), header_bytes_);
  if (index_file_ != nullptr) checksum.Add(index_file_->data(), index_file_->size_bytes());
  const int64_t token_bytes_total = num_tokens_ * token_bytes();
  const int64_t head = std::min(token_bytes_total, kChecksumEdgeBytes);
  const int64_t tail = std::min(token_bytes_total - head, kChecksumEdgeBytes);
  checksum.Add(tokens_, head);
  checksum.Add(tokens_ + token_bytes_total - tail, tail);
  checksum.AddInt64(token_file_->size_bytes());
  checksum.AddInt64(index_file_ != nullptr ? index_file_->size_bytes() : 0);

  identity_.name = BaseName(path_);
  identity_.size_bytes =
      token_file_->size_bytes() + (index_file_ != nullptr ? index_file_->size_bytes() : 0);
  identity_.num_tokens = num_tokens_;
  identity_.checksum = checksum.hash();
}

void TokenShard::CopyTokens(int64_t first, int64_t count, int64_t* out) const {
  const uint8_t* bytes = tokens_ + first * token_bytes();
  switch (token_type_) {
    case TokenType::kUint16:
      Convert<uint16_t>(bytes, count, out);
      break;
    case TokenType::kUint32:
      Convert<uint32_t>(bytes, count, out);
      break;
    case TokenType::kInt32:
      Convert<int32_t>(bytes, count, out);
      break;
  }
}

int64_t TokenShard::TokenAt(int64_t index) const {
  int64_t token = 0;
  CopyTokens(index, 1, &token);
  return token;
}

int64_t TokenShard::SequenceByteOffset(int64_t sequence) const {
  return sequence == num_sequences_ ? num_tokens_ * token_bytes()
                                    : LoadLittleEndian<int64_t>(sequence_offsets_ + 8 * sequence);
}

std::pair<int64_t, int64_t> TokenShard::DocumentTokens(int64_t document) const {
  const int64_t first_sequence = LoadLittleEndian<int64_t>(document_indices_ + 8 * document);
  const int64_t end_sequence = LoadLittleEndian<int64_t>(document_indices_ + 8 * (document + 1));
  return {SequenceByteOffset(first_sequence) / token_bytes(),
          SequenceByteOffset(end_sequence) / token_bytes()};
}

int64_t TokenShard::FindTokenOutsideVocabulary(int64_t first, int64_t count,
                                               int64_t vocabulary_size) const {
  const uint8_t* bytes = tokens_ + first * token_bytes();
  int64_t found = -1;
  switch (token_type_) {
    case TokenType::kUint16:
      if (vocabulary_size > 0xFFFF) return -1;  // no uint16 can reach it
      found = FindOutside<uint16_t>(bytes, count, vocabulary_size);
      break;
    case TokenType::kUint32:
      found = FindOutside<uint32_t>(bytes, count, vocabulary_size);
      break;
    case TokenType::kInt32:
      found = FindOutside<int32_t>(bytes, count, vocabulary_size);
      break;
  }
  return found < 0 ? -1 : first + found;
}

void TokenShard::AdviseSequential() const { token_file_->AdviseSequential(); }

void TokenShard::AdviseNormal() const { token_file_->AdviseNormal(); }

}  // namespace tandem::data::internal
