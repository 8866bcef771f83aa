// Text to token ids and back with a Hugging Face tokenizer.json of the byte-level BPE kind:
// GPT-2's tokenizer and the one scripts/prepare_data.py trains when none is given. The ids are
// those of the Python package `tokenizers` (Tokenizer.encode(text, add_special_tokens=False)
// and Tokenizer.decode), tested on real text.
//
// What is read:
//   * model: "BPE" with its vocab and merges (either serialisation: "a b" strings or ["a", "b"]
//     pairs), ignore_merges (a piece in the vocabulary is one token without merging) and an
//     optional unk_token (characters missing from the vocabulary become it; without one they
//     are dropped, as `tokenizers` drops them).
//   * pre_tokenizer: "ByteLevel" (add_prefix_space: a space is put before a text that does not
//     start with one; use_regex: the text is split by GPT-2's pattern
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ ), each piece's
//     UTF-8 bytes mapped to GPT-2's printable characters (bytes_to_unicode) before BPE.
//   * decoder: "ByteLevel" (the characters back to bytes, invalid UTF-8 replaced by U+FFFD as
//     Rust's from_utf8_lossy does).
//   * post_processor: none or "ByteLevel" (which changes offsets only, not ids).
//   * added_tokens: matched in the text first (special ones, then the others; leftmost,
//     longest), each one id; the text between them is pre-tokenized on its own.
// Refused with InvalidArgument naming the file and what is unsupported: another model type
// (WordPiece, Unigram, WordLevel), a normalizer, another pre-tokenizer or decoder (Metaspace,
// Sequence, Split: Llama 3's and SentencePiece-style tokenizers), another post-processor
// (TemplateProcessing), BPE dropout, continuing_subword_prefix, end_of_word_suffix,
// byte_fallback, added tokens with single_word, lstrip or rstrip, truncation or padding.
//
// Unicode classes are those of Python's unicodedata when scripts/unicode_classes.py ran
// (data/internal/unicode_classes.h); `tokenizers` uses Oniguruma's, which may know a few
// newer code points.
//
// Thread safety: immutable once made; every method may be called from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tandem::data {

class Tokenizer {
 public:
  // Reads and checks a tokenizer.json (see the top of this file). NotFound for a missing file.
  static absl::StatusOr<Tokenizer> FromFile(const std::string& path);
  // The same from the file's text; `source` names it in messages.
  static absl::StatusOr<Tokenizer> FromJson(absl::string_view text, absl::string_view source);

  // The ids of `text`, which must be UTF-8 (InvalidArgument naming the byte offset otherwise).
  absl::StatusOr<std::vector<int64_t>> Encode(absl::string_view text) const;

  // The text of `ids`. Ids the tokenizer has no token for are skipped (as `tokenizers` does;
  // a model's vocabulary may be padded past the tokenizer's); special added tokens are skipped
  // when `skip_special_tokens`.
  std::string Decode(absl::Span<const int64_t> ids, bool skip_special_tokens = false) const;

  // The largest id + 1 (the embedding rows a model needs), added tokens included.
  int64_t vocab_size() const;
  // The id of a token as the vocabulary spells it (byte-level characters: "Ġthe"), or of an
  // added token ("<|endoftext|>"); nullopt when there is none.
  std::optional<int64_t> TokenId(absl::string_view token) const;
  // The file (or source) it was read from.
  const std::string& source() const;

 private:
  struct State;  // vocabulary, merges and options (tokenizer.cc)
  explicit Tokenizer(std::shared_ptr<const State> state) : state_(std::move(state)) {}

  std::shared_ptr<const State> state_;
};

}  // namespace tandem::data
