// Text to token ids and back with a Hugging Face tokenizer.json of the BPE kind: byte-level
// ones (GPT-2's, Llama 3's, the one scripts/prepare_data.py trains when given none) and
// SentencePiece-style ones (Llama 2's, Mistral's, TinyLlama's, Gemma's: characters, with bytes as
// "<0xAB>" tokens where a character is missing). The ids are those of the Python package
// `tokenizers` (Tokenizer.encode(text, add_special_tokens=...) and Tokenizer.decode), tested on
// real text.
//
// What is read, in `tokenizers`' order:
//   * added_tokens: those not `normalized` are matched in the text first (leftmost, longest),
//     each one id; every part between them is normalized on its own, and the normalized ones
//     are matched in it (as the normalizer spells them); the rest is pre-tokenized.
//   * normalizer: none, Prepend, Replace (a String pattern), NFC (Qwen2's; Unicode's canonical
//     composition, data/internal/unicode_nfc.h) or a Sequence of them (Llama 2's Prepend("▁")
//     and Replace(" ", "▁")).
//   * pre_tokenizer: none, or ByteLevel (add_prefix_space: a space before each piece that does
//     not start with one; use_regex: split by GPT-2's pattern
//     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ ; then every
//     byte mapped to GPT-2's printable characters, bytes_to_unicode), Split (behavior
//     Isolated, by GPT-2's pattern, by Llama 3's, or by Qwen2's (Llama 3's with \p{N} for
//     \p{N}{1,3})
//     (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//     \s*[\r\n]+|\s+(?!\S)|\s+ ), Split by a String pattern (Gemma's Split(" ",
//     MergedWithPrevious); any behavior: Removed, Isolated, MergedWithPrevious,
//     MergedWithNext, Contiguous), Metaspace (spaces to the replacement, prepended always, or
//     first: only at the text's start; split or not before each replacement) or a Sequence.
//   * model: "BPE" with its vocab and merges (either serialisation: "a b" strings or ["a", "b"]
//     pairs; merged as `tokenizers` merges, the lowest rank first, leftmost among equals),
//     ignore_merges (a piece in the vocabulary is one token without merging), byte_fallback
//     (a character missing from the vocabulary becomes its bytes' "<0xAB>" tokens) and an
//     optional unk_token (else missing characters become it, one per run with fuse_unk;
//     without one they are dropped, as `tokenizers` drops them).
//   * post_processor: none, ByteLevel (which changes offsets only), TemplateProcessing (its
//     single-text template, applied with add_special_tokens: Llama's beginning-of-text token)
//     or a Sequence of them.
//   * decoder: none (tokens joined by spaces), ByteLevel (the characters back to bytes,
//     invalid UTF-8 replaced by U+FFFD as Rust's from_utf8_lossy does), Replace, ByteFallback,
//     Fuse, Strip, Metaspace, or a Sequence of them.
// Refused with InvalidArgument naming the file and what is unsupported: another model type
// (WordPiece, Unigram, WordLevel), another normalizer (NFKC, NFD, Lowercase, ...: BERT's),
// another pre-tokenizer or decoder, a Split regular expression other than those three (or with
// another behavior than Isolated), an inverted Split, a template
// pair without a single-text one, BPE dropout, continuing_subword_prefix, end_of_word_suffix,
// added tokens with single_word, lstrip or rstrip, truncation or padding.
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
  // With `add_special_tokens` the post-processor's template is applied (a Llama tokenizer's
  // beginning-of-text token first), as `tokenizers`' default and transformers' tokenizer(text)
  // do; without, the text's own ids.
  absl::StatusOr<std::vector<int64_t>> Encode(absl::string_view text,
                                              bool add_special_tokens = false) const;
  // Whether Encode with add_special_tokens adds ids (the file has a template).
  bool AddsSpecialTokens() const;

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
