#include "data/tokenizer.h"

#include <array>
#include <climits>
#include <functional>
#include <queue>
#include <unordered_map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "common/status.h"
#include "data/internal/unicode_classes.h"
#include "data/internal/unicode_nfc.h"
#include "data/internal/utf8.h"

namespace tandem::data {
namespace {

using internal::AppendUtf8;
using internal::IsUnicodeLetter;
using internal::IsUnicodeNumber;
using internal::IsUnicodeWhiteSpace;

// The length of the longest prefix of `bytes` (1 to 4) that starts a well-formed UTF-8
// sequence (Unicode's table 3-7: no overlong forms, no surrogates, nothing past U+10FFFF), and
// whether that prefix is the whole sequence; the code point in `code` when it is.
struct Utf8Step {
  int length = 0;      // bytes taken: at least 1
  bool valid = false;  // a whole code point
};
Utf8Step NextUtf8(absl::string_view bytes, char32_t* code) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) {
    *code = lead;
    return {1, true};
  }
  int need = 0;
  unsigned char low = 0x80, high = 0xBF;  // the second byte's range
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 2;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 3;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return {1, false};
  }
  char32_t value = lead & (0x3F >> need);
  for (int i = 1; i <= need; ++i) {
    if (static_cast<size_t>(i) >= bytes.size()) return {i, false};
    const unsigned char next = byte(i);
    const unsigned char lo = i == 1 ? low : 0x80, hi = i == 1 ? high : 0xBF;
    if (next < lo || next > hi) return {i, false};
    value = (value << 6) | (next & 0x3F);
  }
  *code = value;
  return {need + 1, true};
}

// `bytes` as UTF-8 with each maximal ill-formed subpart replaced by U+FFFD (Rust's
// String::from_utf8_lossy, what `tokenizers`' ByteLevel decoder returns).
std::string LossyUtf8(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    char32_t code = 0;
    const Utf8Step step = NextUtf8(bytes.substr(pos), &code);
    if (step.valid) {
      out.append(bytes.data() + pos, step.length);
    } else {
      out.append("\xEF\xBF\xBD");
    }
    pos += step.length;
  }
  return out;
}

// `text` as code points with the byte offset of each (and of the end, last).
absl::Status DecodeUtf8(absl::string_view text, std::vector<char32_t>* codes,
                        std::vector<size_t>* offsets) {
  codes->clear();
  offsets->clear();
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t code = 0;
    const Utf8Step step = NextUtf8(text.substr(pos), &code);
    if (!step.valid) {
      return absl::InvalidArgumentError(
          absl::StrCat("the text is not UTF-8: an invalid byte sequence at byte ", pos));
    }
    codes->push_back(code);
    offsets->push_back(pos);
    pos += step.length;
  }
  offsets->push_back(pos);
  return absl::OkStatus();
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for code points
// from U+0100 on, in byte order.
std::array<char32_t, 256> ByteCharacters() {
  std::array<char32_t, 256> chars{};
  const auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) chars[b] = printable(b) ? static_cast<char32_t>(b) : next++;
  return chars;
}

// The classes GPT-2's pattern distinguishes.
enum class CharClass { kLetter, kNumber, kSpace, kOther };
CharClass Classify(char32_t code) {
  if (IsUnicodeWhiteSpace(code)) return CharClass::kSpace;
  if (IsUnicodeLetter(code)) return CharClass::kLetter;
  if (IsUnicodeNumber(code)) return CharClass::kNumber;
  return CharClass::kOther;
}

// The end (code point index) of the match of GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// at `i` of `codes` (which the alternatives cover: every position has one).
size_t MatchGpt2Piece(const std::vector<char32_t>& codes, const std::vector<CharClass>& classes,
                      size_t i) {
  const size_t n = codes.size();
  const char32_t c = codes[i];
  if (c == '\'' && i + 1 < n) {
    const char32_t a = codes[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 < n) {
      const char32_t b = codes[i + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        return i + 3;
      }
    }
  }
  // ` ?X+` for X letters, numbers or the rest: a space takes the run after it.
  size_t start = i;
  if (c == ' ' && i + 1 < n && classes[i + 1] != CharClass::kSpace) start = i + 1;
  if (classes[start] != CharClass::kSpace) {
    const CharClass run = classes[start];
    size_t end = start;
    while (end < n && classes[end] == run) ++end;
    return end;
  }
  // \s+(?!\S): the white space, less its last character when something follows (which that
  // character then joins); \s+ for a single one before something.
  size_t end = i;
  while (end < n && classes[end] == CharClass::kSpace) ++end;
  if (end == n || end - i == 1) return end;
  return end - 1;
}

bool IsNewline(char32_t code) { return code == '\r' || code == '\n'; }

// The end of the match of Llama 3's pattern
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// at `i` (the first alternative that matches, as Oniguruma takes them; every position has one).
// Qwen2's pattern is the same with \p{N} for \p{N}{1,3}: max_digits 1.
size_t MatchLlama3Piece(const std::vector<char32_t>& codes, const std::vector<CharClass>& classes,
                        size_t i, size_t max_digits = 3) {
  const size_t n = codes.size();
  const auto lower = [&](size_t k) {
    const char32_t c = codes[k];
    return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c;
  };
  const char32_t c = codes[i];
  if (c == '\'' && i + 1 < n) {
    const char32_t a = lower(i + 1);
    if (a == 's' || a == 't') return i + 2;
    if (i + 2 < n) {
      const char32_t b = lower(i + 2);
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e')) return i + 3;
    }
    if (a == 'm') return i + 2;
    if (i + 2 < n && a == 'l' && lower(i + 2) == 'l') return i + 3;
    if (a == 'd') return i + 2;
  }
  const auto run_end = [&](size_t from, CharClass run) {
    while (from < n && classes[from] == run) ++from;
    return from;
  };
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (classes[i] == CharClass::kLetter) return run_end(i, CharClass::kLetter);
  if (classes[i] != CharClass::kNumber && !IsNewline(c) && i + 1 < n &&
      classes[i + 1] == CharClass::kLetter) {
    return run_end(i + 1, CharClass::kLetter);
  }
  // \p{N}{1,3}
  if (classes[i] == CharClass::kNumber) {
    size_t end = i;
    while (end < n && end < i + max_digits && classes[end] == CharClass::kNumber) ++end;
    return end;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  size_t start = i;
  if (c == ' ' && i + 1 < n && classes[i + 1] == CharClass::kOther) start = i + 1;
  if (classes[start] == CharClass::kOther) {
    size_t end = run_end(start, CharClass::kOther);
    while (end < n && IsNewline(codes[end])) ++end;
    return end;
  }
  // White space from here on: \s*[\r\n]+ ends after the run's last line break; else
  // \s+(?!\S) leaves the run's last character to what follows; else \s+.
  const size_t end = run_end(i, CharClass::kSpace);
  for (size_t k = end; k > i; --k) {
    if (IsNewline(codes[k - 1])) return k;
  }
  if (end == n || end - i == 1) return end;
  return end - 1;
}

// The Split pre-tokenizer's patterns tandem knows, as tokenizer.json spells them.
// kLiteral: a string (PreTokenizerStep::literal), matched where it occurs.
enum class SplitPattern { kGpt2, kLlama3, kQwen2, kLiteral };
// What a Split does with its matches (the regular expressions take kIsolated only).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
constexpr char kGpt2Pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
constexpr char kLlama3Pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

constexpr char kQwen2Pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

struct AddedToken {
  std::string content;  // as matched: normalized when the token is
  int64_t id = 0;
};

// A piece of the text on its way to the model: an added token (id >= 0) or text (id < 0);
// `at_origin` when it starts at the text's first byte (Metaspace's "first" prepend scheme).
struct Piece {
  std::string text;
  int64_t id = -1;
  bool at_origin = false;
};

// The Split pre-tokenizer by the string `literal` (tokenizers' SplitDelimiterBehavior): the
// piece's text cut into its occurrences of `literal`, left to right without overlap, and the
// text between them; then the occurrences removed, kept alone, joined to the text before them
// or after them (unless that is an occurrence too), or runs of them joined; empty parts
// dropped. The first part keeps the piece's place at the origin.
void SplitAtLiteral(const Piece& piece, const std::string& literal, SplitBehavior behavior,
                    std::vector<Piece>* out) {
  struct Part {
    size_t begin, end;
    bool match;
  };
  std::vector<Part> parts;
  const std::string& text = piece.text;
  for (size_t from = 0;;) {
    const size_t found = text.find(literal, from);
    const size_t end = found == std::string::npos ? text.size() : found;
    if (end > from) parts.push_back({from, end, false});
    if (found == std::string::npos) break;
    parts.push_back({found, found + literal.size(), true});
    from = found + literal.size();
  }
  std::vector<Part> kept;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Part& part : parts) {
        if (!part.match) kept.push_back(part);
      }
      break;
    case SplitBehavior::kIsolated:
      kept = parts;
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Part& part : parts) {
        if (part.match && !previous_match && !kept.empty()) {
          kept.back().end = part.end;
        } else {
          kept.push_back(part);
        }
        previous_match = part.match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->match && !previous_match && !kept.empty()) {
          kept.back().begin = it->begin;
        } else {
          kept.push_back(*it);
        }
        previous_match = it->match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    case SplitBehavior::kContiguous:
      for (const Part& part : parts) {
        if (part.match == previous_match && !kept.empty()) {
          kept.back().end = part.end;
        } else {
          kept.push_back(part);
        }
        previous_match = part.match;
      }
      break;
  }
  for (const Part& part : kept) {
    out->push_back(
        {text.substr(part.begin, part.end - part.begin), -1, piece.at_origin && part.begin == 0});
  }
}

// Splits `text` at the leftmost-longest occurrences of `tokens` (bucketed by first byte),
// appending the parts that are not empty.
void SplitAtTokens(const Piece& text, const std::array<std::vector<AddedToken>, 256>& tokens,
                   bool any, std::vector<Piece>* out) {
  if (text.text.empty()) return;
  if (!any) {
    out->push_back(text);
    return;
  }
  const absl::string_view view = text.text;
  size_t from = 0;
  for (size_t i = 0; i < view.size();) {
    const AddedToken* best = nullptr;
    for (const AddedToken& token : tokens[static_cast<unsigned char>(view[i])]) {
      if ((best == nullptr || token.content.size() > best->content.size()) &&
          absl::StartsWith(view.substr(i), token.content)) {
        best = &token;
      }
    }
    if (best == nullptr) {
      ++i;
      continue;
    }
    if (i > from) {
      out->push_back({std::string(view.substr(from, i - from)), -1, text.at_origin && from == 0});
    }
    out->push_back({best->content, best->id, false});
    i += best->content.size();
    from = i;
  }
  if (from < view.size()) {
    out->push_back({std::string(view.substr(from)), -1, text.at_origin && from == 0});
  }
}

// Every occurrence of `from` (not empty) in `text` replaced by `to`, left to right.
std::string ReplaceAll(absl::string_view text, absl::string_view from, absl::string_view to) {
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t hit = text.find(from, pos);
    if (hit == absl::string_view::npos) break;
    out.append(text.data() + pos, hit - pos);
    out.append(to.data(), to.size());
    pos = hit + from.size();
  }
  out.append(text.data() + pos, text.size() - pos);
  return out;
}

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
         static_cast<uint32_t>(right);
}

// A normalizer step: Prepend (`text` before a non-empty text), Replace (`from` by `text`) or
// NFC.
struct NormalizerStep {
  enum Kind { kPrepend, kReplace, kNfc } kind = kPrepend;
  std::string from, text;
};

// A pre-tokenizer step.
struct PreTokenizerStep {
  enum Kind { kByteLevel, kSplit, kMetaspace } kind = kByteLevel;
  bool add_prefix_space = false;               // ByteLevel
  bool use_regex = true;                       // ByteLevel: GPT-2's pattern
  SplitPattern pattern = SplitPattern::kGpt2;  // Split
  std::string literal;                         // Split by a string: the string
  SplitBehavior behavior = SplitBehavior::kIsolated;  // Split
  std::string replacement;                     // Metaspace
  enum Prepend { kAlways, kFirst, kNever } prepend = kAlways;
  bool split = true;
};

// A decoder step (tokenizers' decode_chain: token strings in, token strings out).
struct DecoderStep {
  enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind = kByteLevel;
  std::string from, to;  // Replace; Metaspace's replacement in `from`
  char32_t content = 0;  // Strip
  int start = 0, stop = 0;
  bool prepend = true;  // Metaspace: its scheme is not "never"
};

// One item of a TemplateProcessing's single-sequence template: the encoded text, or ids.
struct TemplateItem {
  bool sequence = false;
  std::vector<int64_t> ids;
};

}  // namespace

struct Tokenizer::State {
  std::string source;
  std::unordered_map<std::string, int32_t> vocab;  // the model's: spelling -> id
  struct Merge {
    int32_t rank = 0;
    int32_t id = 0;  // of the merged token
  };
  std::unordered_map<uint64_t, Merge> merges;  // PairKey(left, right) ->
  int32_t unk_id = -1;
  bool fuse_unk = false;
  bool ignore_merges = false;
  bool byte_fallback = false;
  std::array<int32_t, 256> byte_tokens{};  // byte_fallback: the id of "<0xAB>", -1 if none
  std::vector<NormalizerStep> normalizer;
  std::vector<PreTokenizerStep> pre_tokenizer;
  std::vector<DecoderStep> decoder;
  bool has_decoder = false;                   // without one, tokens are joined with spaces
  std::vector<TemplateItem> single_template;  // empty: none
  // Added tokens matched in the text as given, and (normalized ones) in the normalized text.
  std::array<std::vector<AddedToken>, 256> plain_tokens, normalized_tokens;  // by first byte
  bool any_plain = false, any_normalized = false;
  std::unordered_map<std::string, int64_t> added_ids;
  // By id: the token text decoding starts from (an added token's content over the model's),
  // whether there is one, whether it is a special added token.
  std::vector<std::string> tokens;
  std::vector<bool> known, special;
  std::array<char32_t, 256> byte_chars{};
  std::array<std::string, 256> byte_char_text;  // byte_chars as UTF-8
  std::unordered_map<char32_t, unsigned char> char_bytes;

  std::string Normalize(absl::string_view text) const;
  absl::Status PreTokenize(std::vector<Piece>* pieces) const;
  void EncodeWord(absl::string_view word, std::vector<int64_t>* ids) const;
  std::vector<std::string> DecodeChain(std::vector<std::string> tokens) const;
};

std::string Tokenizer::State::Normalize(absl::string_view text) const {
  std::string out(text);
  for (const NormalizerStep& step : normalizer) {
    if (step.kind == NormalizerStep::kPrepend) {
      if (!out.empty()) out = step.text + out;
    } else if (step.kind == NormalizerStep::kReplace) {
      out = ReplaceAll(out, step.from, step.text);
    } else {
      std::vector<char32_t> codes;
      std::vector<size_t> offsets;
      if (!DecodeUtf8(out, &codes, &offsets).ok()) continue;  // Encode checked the text
      internal::ToNfc(&codes);
      out.clear();
      for (const char32_t code : codes) AppendUtf8(code, &out);
    }
  }
  return out;
}

absl::Status Tokenizer::State::PreTokenize(std::vector<Piece>* pieces) const {
  std::vector<Piece> next;
  std::vector<char32_t> codes;
  std::vector<size_t> offsets;
  std::vector<CharClass> classes;
  // The pieces of `text` cut where `pattern` matches (every character is in a match).
  const auto split = [&](const Piece& piece, SplitPattern pattern) -> absl::Status {
    TANDEM_RETURN_IF_ERROR(DecodeUtf8(piece.text, &codes, &offsets));
    classes.resize(codes.size());
    for (size_t i = 0; i < codes.size(); ++i) classes[i] = Classify(codes[i]);
    for (size_t i = 0; i < codes.size();) {
      const size_t end = pattern == SplitPattern::kGpt2    ? MatchGpt2Piece(codes, classes, i)
                         : pattern == SplitPattern::kQwen2 ? MatchLlama3Piece(codes, classes, i, 1)
                                                           : MatchLlama3Piece(codes, classes, i);
      next.push_back({piece.text.substr(offsets[i], offsets[end] - offsets[i]), -1,
                      piece.at_origin && i == 0});
      i = end;
    }
    return absl::OkStatus();
  };
  for (const PreTokenizerStep& step : pre_tokenizer) {
    next.clear();
    for (Piece& piece : *pieces) {
      if (piece.id >= 0) {
        next.push_back(std::move(piece));
        continue;
      }
      switch (step.kind) {
        case PreTokenizerStep::kByteLevel: {
          if (step.add_prefix_space && !absl::StartsWith(piece.text, " ")) {
            piece.text.insert(0, " ");
          }
          const size_t first = next.size();
          if (step.use_regex) {
            TANDEM_RETURN_IF_ERROR(split(piece, SplitPattern::kGpt2));
          } else {
            next.push_back(std::move(piece));
          }
          for (size_t k = first; k < next.size(); ++k) {
            std::string mapped;
            for (char b : next[k].text) mapped += byte_char_text[static_cast<unsigned char>(b)];
            next[k].text = std::move(mapped);
          }
          break;
        }
        case PreTokenizerStep::kSplit:
          if (step.pattern == SplitPattern::kLiteral) {
            SplitAtLiteral(piece, step.literal, step.behavior, &next);
          } else {
            TANDEM_RETURN_IF_ERROR(split(piece, step.pattern));
          }
          break;
        case PreTokenizerStep::kMetaspace: {
          std::string text = ReplaceAll(piece.text, " ", step.replacement);
          if (!absl::StartsWith(text, step.replacement) &&
              (step.prepend == PreTokenizerStep::kAlways ||
               (step.prepend == PreTokenizerStep::kFirst && piece.at_origin))) {
            text.insert(0, step.replacement);
          }
          if (!step.split) {
            next.push_back({std::move(text), -1, piece.at_origin});
            break;
          }
          // Each replacement character starts a piece (merged with what follows it).
          size_t from = 0;
          while (from < text.size()) {
            size_t cut = text.find(step.replacement, from + 1);
            if (from == 0 && !absl::StartsWith(text, step.replacement)) {
              cut = text.find(step.replacement);
            }
            if (cut == std::string::npos) cut = text.size();
            next.push_back({text.substr(from, cut - from), -1, piece.at_origin && from == 0});
            from = cut;
          }
          break;
        }
      }
    }
    pieces->swap(next);
  }
  return absl::OkStatus();
}

void Tokenizer::State::EncodeWord(absl::string_view word, std::vector<int64_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges) {
    auto it = vocab.find(std::string(word));
    if (it != vocab.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  // The word's characters as symbols: a character in the vocabulary is its token; else its
  // bytes' "<0xAB>" tokens (byte_fallback, when all exist); else the unknown token (one for a
  // run of them with fuse_unk), or nothing without one. As `tokenizers`' BPE::merge_word: a
  // pending unknown token is written before the next known character, not before byte tokens.
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  bool pending_unknown = false;
  for (size_t pos = 0; pos < word.size();) {
    char32_t code = 0;
    const size_t length = static_cast<size_t>(NextUtf8(word.substr(pos), &code).length);
    const absl::string_view character = word.substr(pos, length);
    pos += length;
    if (auto it = vocab.find(std::string(character)); it != vocab.end()) {
      if (pending_unknown) symbols.push_back(unk_id);
      pending_unknown = false;
      symbols.push_back(it->second);
      continue;
    }
    if (byte_fallback) {
      bool all = true;
      for (char b : character) all = all && byte_tokens[static_cast<unsigned char>(b)] >= 0;
      if (all) {
        for (char b : character) symbols.push_back(byte_tokens[static_cast<unsigned char>(b)]);
        continue;
      }
    }
    if (unk_id < 0) continue;
    if (pending_unknown && !fuse_unk) symbols.push_back(unk_id);
    pending_unknown = true;
  }
  if (pending_unknown) symbols.push_back(unk_id);

  // Merges as `tokenizers`' Word::merge_all: a queue of candidate pairs ordered by rank, then
  // position; a popped pair whose symbols changed since it was queued is dropped.
  struct Candidate {
    int32_t rank;
    int32_t position;
    int32_t merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : position > o.position;
    }
  };
  const int32_t count = static_cast<int32_t>(symbols.size());
  std::vector<int32_t> previous(count), following(count);
  std::vector<bool> gone(count, false);
  for (int32_t k = 0; k < count; ++k) {
    previous[k] = k - 1;
    following[k] = k + 1 < count ? k + 1 : -1;
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto offer = [&](int32_t left) {
    const int32_t right = following[left];
    if (right < 0) return;
    auto it = merges.find(PairKey(symbols[left], symbols[right]));
    if (it != merges.end()) queue.push({it->second.rank, left, it->second.id});
  };
  for (int32_t k = 0; k + 1 < count; ++k) offer(k);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const int32_t left = top.position;
    if (gone[left] || following[left] < 0) continue;
    const int32_t right = following[left];
    auto it = merges.find(PairKey(symbols[left], symbols[right]));
    if (it == merges.end() || it->second.id != top.merged) continue;
    symbols[left] = top.merged;
    gone[right] = true;
    following[left] = following[right];
    if (following[left] >= 0) previous[following[left]] = left;
    if (previous[left] >= 0) offer(previous[left]);
    offer(left);
  }
  for (int32_t k = 0; k < count; ++k) {
    if (!gone[k]) ids->push_back(symbols[k]);
  }
}

std::vector<std::string> Tokenizer::State::DecodeChain(std::vector<std::string> tokens) const {
  std::vector<char32_t> codes;
  std::vector<size_t> offsets;
  for (const DecoderStep& step : decoder) {
    std::vector<std::string> out;
    switch (step.kind) {
      case DecoderStep::kByteLevel: {
        // Each character back to its byte (a token with a character that stands for no byte
        // is taken as it is), all tokens as one text.
        std::string bytes;
        for (const std::string& token : tokens) {
          bool all_bytes = DecodeUtf8(token, &codes, &offsets).ok();
          std::string token_bytes;
          for (size_t i = 0; all_bytes && i < codes.size(); ++i) {
            auto it = char_bytes.find(codes[i]);
            if (it == char_bytes.end()) {
              all_bytes = false;
            } else {
              token_bytes.push_back(static_cast<char>(it->second));
            }
          }
          bytes += all_bytes ? token_bytes : token;
        }
        out.push_back(LossyUtf8(bytes));
        break;
      }
      case DecoderStep::kReplace:
        for (const std::string& token : tokens) {
          out.push_back(ReplaceAll(token, step.from, step.to));
        }
        break;
      case DecoderStep::kByteFallback: {
        // Runs of "<0xAB>" tokens become their bytes' text, or one U+FFFD per byte when the
        // bytes are not UTF-8.
        std::string run;
        size_t run_length = 0;
        const auto flush = [&] {
          if (run_length == 0) return;
          if (LossyUtf8(run) == run) {
            out.push_back(run);
          } else {
            for (size_t k = 0; k < run_length; ++k) out.push_back("\xEF\xBF\xBD");
          }
          run.clear();
          run_length = 0;
        };
        for (std::string& token : tokens) {
          int value = -1;
          if (token.size() == 6 && absl::StartsWith(token, "<0x") && token[5] == '>') {
            const auto hex = [](char h) {
              if (h >= '0' && h <= '9') return h - '0';
              if (h >= 'a' && h <= 'f') return h - 'a' + 10;
              if (h >= 'A' && h <= 'F') return h - 'A' + 10;
              return -1;
            };
            const int high = hex(token[3]), low = hex(token[4]);
            if (high >= 0 && low >= 0) value = high * 16 + low;
          }
          if (value >= 0) {
            run.push_back(static_cast<char>(value));
            ++run_length;
          } else {
            flush();
            out.push_back(std::move(token));
          }
        }
        flush();
        break;
      }
      case DecoderStep::kFuse: {
        std::string all;
        for (const std::string& token : tokens) all += token;
        out.push_back(std::move(all));
        break;
      }
      case DecoderStep::kStrip:
        for (const std::string& token : tokens) {
          if (!DecodeUtf8(token, &codes, &offsets).ok()) {
            out.push_back(token);
            continue;
          }
          size_t begin = 0, end = codes.size();
          for (int k = 0; k < step.start && begin < end && codes[begin] == step.content; ++k) {
            ++begin;
          }
          for (int k = 0; k < step.stop && end > begin && codes[end - 1] == step.content; ++k) {
            --end;
          }
          out.push_back(token.substr(offsets[begin], offsets[end] - offsets[begin]));
        }
        break;
      case DecoderStep::kMetaspace:
        // Every replacement character becomes a space; in the first token, with a prepend
        // scheme, every one is dropped (as `tokenizers` does).
        for (size_t i = 0; i < tokens.size(); ++i) {
          out.push_back(ReplaceAll(tokens[i], step.from, i == 0 && step.prepend ? "" : " "));
        }
        break;
    }
    tokens.swap(out);
  }
  return tokens;
}

namespace {

// InvalidArgument "SOURCE: WHAT is not supported (WHY)".
absl::Status Unsupported(absl::string_view source, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      source, ": ", what,
      " is not supported (tandem reads BPE tokenizers: byte-level ones as GPT-2's and Llama "
      "3's, and SentencePiece-style ones as Llama 2's; see data/tokenizer.h)"));
}

bool IsNullOr(const Json& object, const char* field, const Json& allowed) {
  return !IsSet(object, field) || object.at(field) == allowed;
}

std::string TypeOf(const Json& object) {
  if (object.is_object() && object.contains("type") && object.at("type").is_string()) {
    return object.at("type").get<std::string>();
  }
  return object.dump().substr(0, 80);
}

// The steps of a component that may be a Sequence of steps (under `list_field`).
absl::StatusOr<std::vector<const Json*>> Steps(const Json& component, const char* list_field,
                                               const std::string& where) {
  std::vector<const Json*> steps;
  if (TypeOf(component) != "Sequence") {
    steps.push_back(&component);
    return steps;
  }
  TANDEM_ASSIGN_OR_RETURN(const Json* list, GetArray(component, list_field, where));
  for (const Json& step : *list) steps.push_back(&step);
  return steps;
}

// A Replace normalizer's or decoder's {"String": "..."} pattern (not a Regex).
absl::StatusOr<std::string> StringPattern(const Json& step, absl::string_view source,
                                          const std::string& where) {
  if (!step.contains("pattern") || !step.at("pattern").is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected a pattern object"));
  }
  const Json& pattern = step.at("pattern");
  if (!pattern.contains("String") || !pattern.at("String").is_string()) {
    return Unsupported(source, absl::StrCat(where, " with the pattern ", pattern.dump()));
  }
  std::string text = pattern.at("String").get<std::string>();
  if (text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": an empty pattern"));
  }
  return text;
}

// One character, as Metaspace's replacement and Strip's content are.
absl::StatusOr<char32_t> OneCharacter(const Json& step, const char* field,
                                      const std::string& where) {
  TANDEM_ASSIGN_OR_RETURN(const std::string text, GetString(step, field, where));
  char32_t code = 0;
  if (text.empty() || !NextUtf8(text, &code).valid ||
      static_cast<size_t>(NextUtf8(text, &code).length) != text.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".", field, ": expected one character, got '", text, "'"));
  }
  return code;
}

absl::StatusOr<PreTokenizerStep::Prepend> PrependScheme(const Json& step,
                                                        const std::string& where) {
  PreTokenizerStep::Prepend scheme = PreTokenizerStep::kAlways;
  if (IsSet(step, "prepend_scheme")) {
    TANDEM_ASSIGN_OR_RETURN(const std::string name, GetString(step, "prepend_scheme", where));
    if (name == "always") {
      scheme = PreTokenizerStep::kAlways;
    } else if (name == "first") {
      scheme = PreTokenizerStep::kFirst;
    } else if (name == "never") {
      scheme = PreTokenizerStep::kNever;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".prepend_scheme: '", name, "' is not always, first or never"));
    }
  }
  // Files from before prepend_scheme say add_prefix_space.
  TANDEM_ASSIGN_OR_RETURN(const bool add_prefix_space,
                          GetBoolOrUnset(step, "add_prefix_space", true, where));
  if (!add_prefix_space) scheme = PreTokenizerStep::kNever;
  return scheme;
}

}  // namespace

absl::StatusOr<Tokenizer> Tokenizer::FromFile(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  return FromJson(text, path);
}

absl::StatusOr<Tokenizer> Tokenizer::FromJson(absl::string_view text, absl::string_view source) {
  TANDEM_ASSIGN_OR_RETURN(const Json json, ParseJson(text, source));
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": expected a JSON object"));
  }
  auto state = std::make_shared<State>();
  state->source = std::string(source);
  const std::string where = std::string(source);
  if (!IsNullOr(json, "truncation", Json())) return Unsupported(source, "truncation");
  if (!IsNullOr(json, "padding", Json())) return Unsupported(source, "padding");

  // The normalizer: Prepend and Replace steps, or none.
  if (IsSet(json, "normalizer")) {
    const std::string at = where + ": normalizer";
    TANDEM_ASSIGN_OR_RETURN(const std::vector<const Json*> steps,
                            Steps(json.at("normalizer"), "normalizers", at));
    for (const Json* step : steps) {
      NormalizerStep made;
      const std::string type = TypeOf(*step);
      if (type == "Prepend") {
        made.kind = NormalizerStep::kPrepend;
        TANDEM_ASSIGN_OR_RETURN(made.text, GetString(*step, "prepend", at));
      } else if (type == "Replace") {
        made.kind = NormalizerStep::kReplace;
        TANDEM_ASSIGN_OR_RETURN(made.from, StringPattern(*step, source, at + " Replace"));
        TANDEM_ASSIGN_OR_RETURN(made.text, GetString(*step, "content", at));
      } else if (type == "NFC") {
        made.kind = NormalizerStep::kNfc;
      } else {
        return Unsupported(source, absl::StrCat("the normalizer ", type));
      }
      state->normalizer.push_back(std::move(made));
    }
  }

  // The pre-tokenizer: ByteLevel, Split by GPT-2's, Llama 3's or Qwen2's pattern or by a string,
  // Metaspace, a Sequence of them, or none.
  if (IsSet(json, "pre_tokenizer")) {
    const std::string at = where + ": pre_tokenizer";
    TANDEM_ASSIGN_OR_RETURN(const std::vector<const Json*> steps,
                            Steps(json.at("pre_tokenizer"), "pretokenizers", at));
    for (const Json* step : steps) {
      PreTokenizerStep made;
      const std::string type = TypeOf(*step);
      if (type == "ByteLevel") {
        made.kind = PreTokenizerStep::kByteLevel;
        TANDEM_ASSIGN_OR_RETURN(made.add_prefix_space,
                                GetBoolOrUnset(*step, "add_prefix_space", true, at));
        TANDEM_ASSIGN_OR_RETURN(made.use_regex, GetBoolOrUnset(*step, "use_regex", true, at));
      } else if (type == "Split") {
        made.kind = PreTokenizerStep::kSplit;
        const Json pattern = step->contains("pattern") ? step->at("pattern") : Json();
        const std::string regex =
            pattern.is_object() && pattern.contains("Regex") && pattern.at("Regex").is_string()
                ? pattern.at("Regex").get<std::string>()
                : std::string();
        const bool literal = pattern.is_object() && pattern.contains("String") &&
                             pattern.at("String").is_string() &&
                             !pattern.at("String").get<std::string>().empty();
        if (literal) {
          made.pattern = SplitPattern::kLiteral;
          made.literal = pattern.at("String").get<std::string>();
        } else if (regex == kGpt2Pattern) {
          made.pattern = SplitPattern::kGpt2;
        } else if (regex == kLlama3Pattern) {
          made.pattern = SplitPattern::kLlama3;
        } else if (regex == kQwen2Pattern) {
          made.pattern = SplitPattern::kQwen2;
        } else {
          return Unsupported(
              source, absl::StrCat("the Split pre-tokenizer's pattern ", pattern.dump(),
                                   " (known: GPT-2's, Llama 3's and Qwen2's regular expressions)"));
        }
        const std::string behavior = step->contains("behavior") && step->at("behavior").is_string()
                                         ? step->at("behavior").get<std::string>()
                                         : std::string();
        TANDEM_ASSIGN_OR_RETURN(const bool invert, GetBoolOrUnset(*step, "invert", false, at));
        const std::pair<const char*, SplitBehavior> behaviors[] = {
            {"Removed", SplitBehavior::kRemoved},
            {"Isolated", SplitBehavior::kIsolated},
            {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
            {"MergedWithNext", SplitBehavior::kMergedWithNext},
            {"Contiguous", SplitBehavior::kContiguous}};
        bool known = false;
        for (const auto& [name, value] : behaviors) {
          if (behavior == name) {
            made.behavior = value;
            known = true;
          }
        }
        if (invert || !known || (!literal && made.behavior != SplitBehavior::kIsolated)) {
          return Unsupported(
              source, absl::StrCat("the Split pre-tokenizer with behavior '", behavior, "'",
                                   invert ? " inverted" : "",
                                   literal ? " (a string pattern takes Removed, Isolated, "
                                             "MergedWithPrevious, MergedWithNext and Contiguous)"
                                           : " (a regular expression takes Isolated)"));
        }
      } else if (type == "Metaspace") {
        made.kind = PreTokenizerStep::kMetaspace;
        TANDEM_ASSIGN_OR_RETURN(const char32_t replacement, OneCharacter(*step, "replacement", at));
        AppendUtf8(replacement, &made.replacement);
        TANDEM_ASSIGN_OR_RETURN(made.prepend, PrependScheme(*step, at));
        TANDEM_ASSIGN_OR_RETURN(made.split, GetBoolOrUnset(*step, "split", true, at));
      } else {
        return Unsupported(source, absl::StrCat("the pre-tokenizer ", type));
      }
      state->pre_tokenizer.push_back(std::move(made));
    }
  }

  // The decoder: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, a Sequence of them,
  // or none (tokens joined by spaces).
  if (IsSet(json, "decoder")) {
    const std::string at = where + ": decoder";
    state->has_decoder = true;
    TANDEM_ASSIGN_OR_RETURN(const std::vector<const Json*> steps,
                            Steps(json.at("decoder"), "decoders", at));
    for (const Json* step : steps) {
      DecoderStep made;
      const std::string type = TypeOf(*step);
      if (type == "ByteLevel") {
        made.kind = DecoderStep::kByteLevel;
      } else if (type == "Replace") {
        made.kind = DecoderStep::kReplace;
        TANDEM_ASSIGN_OR_RETURN(made.from, StringPattern(*step, source, at + " Replace"));
        TANDEM_ASSIGN_OR_RETURN(made.to, GetString(*step, "content", at));
      } else if (type == "ByteFallback") {
        made.kind = DecoderStep::kByteFallback;
      } else if (type == "Fuse") {
        made.kind = DecoderStep::kFuse;
      } else if (type == "Strip") {
        made.kind = DecoderStep::kStrip;
        TANDEM_ASSIGN_OR_RETURN(made.content, OneCharacter(*step, "content", at));
        TANDEM_ASSIGN_OR_RETURN(const int64_t start, GetInt(*step, "start", at));
        TANDEM_ASSIGN_OR_RETURN(const int64_t stop, GetInt(*step, "stop", at));
        if (start < 0 || stop < 0 || start > INT_MAX || stop > INT_MAX) {
          return absl::InvalidArgumentError(absl::StrCat(at, " Strip: a negative count"));
        }
        made.start = static_cast<int>(start);
        made.stop = static_cast<int>(stop);
      } else if (type == "Metaspace") {
        made.kind = DecoderStep::kMetaspace;
        TANDEM_ASSIGN_OR_RETURN(const char32_t replacement, OneCharacter(*step, "replacement", at));
        AppendUtf8(replacement, &made.from);
        TANDEM_ASSIGN_OR_RETURN(const PreTokenizerStep::Prepend scheme, PrependScheme(*step, at));
        made.prepend = scheme != PreTokenizerStep::kNever;
      } else {
        return Unsupported(source, absl::StrCat("the decoder ", type));
      }
      state->decoder.push_back(std::move(made));
    }
  }

  // The model.
  TANDEM_ASSIGN_OR_RETURN(const Json* model, GetObject(json, "model", where));
  const std::string model_where = where + ": model";
  const std::string type =
      model->contains("type") ? TypeOf(*model) : (model->contains("merges") ? "BPE" : "?");
  if (type != "BPE") return Unsupported(source, absl::StrCat("the model type ", type));
  if (IsSet(*model, "dropout") &&
      !(model->at("dropout").is_number() && model->at("dropout").get<double>() == 0.0)) {
    return Unsupported(source, "BPE dropout");
  }
  if (!IsNullOr(*model, "continuing_subword_prefix", Json(""))) {
    return Unsupported(source, "continuing_subword_prefix");
  }
  if (!IsNullOr(*model, "end_of_word_suffix", Json(""))) {
    return Unsupported(source, "end_of_word_suffix");
  }
  TANDEM_ASSIGN_OR_RETURN(state->byte_fallback,
                          GetBoolOrUnset(*model, "byte_fallback", false, model_where));
  TANDEM_ASSIGN_OR_RETURN(state->fuse_unk, GetBoolOrUnset(*model, "fuse_unk", false, model_where));
  TANDEM_ASSIGN_OR_RETURN(state->ignore_merges,
                          GetBoolOrUnset(*model, "ignore_merges", false, model_where));
  TANDEM_ASSIGN_OR_RETURN(const Json* vocab, GetObject(*model, "vocab", model_where));
  int64_t largest = -1;
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_where, ".vocab: '", token, "': expected an id in [0, 2^31)"));
    }
    state->vocab.emplace(token, static_cast<int32_t>(id.get<int64_t>()));
    largest = std::max(largest, id.get<int64_t>());
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = state->vocab.find(absl::StrFormat("<0x%02X>", b));
    state->byte_tokens[b] = it == state->vocab.end() ? -1 : it->second;
  }
  TANDEM_ASSIGN_OR_RETURN(const Json* merges, GetArray(*model, "merges", model_where));
  int32_t rank = 0;
  for (const Json& merge : *merges) {
    std::string left, right;
    if (merge.is_string()) {
      const std::string line = merge.get<std::string>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            model_where, ".merges[", rank, "]: '", line, "' is not two tokens with a space"));
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          model_where, ".merges[", rank, "]: expected \"a b\" or [\"a\", \"b\"]"));
    }
    const auto a = state->vocab.find(left), b = state->vocab.find(right);
    const auto ab = state->vocab.find(left + right);
    if (a == state->vocab.end() || b == state->vocab.end() || ab == state->vocab.end()) {
      return absl::InvalidArgumentError(absl::StrCat(model_where, ".merges[", rank, "]: '", left,
                                                     "' + '", right,
                                                     "': a token missing from the vocabulary"));
    }
    // A pair listed twice keeps its first rank, as `tokenizers` does.
    state->merges.emplace(PairKey(a->second, b->second), State::Merge{rank, ab->second});
    ++rank;
  }
  if (IsSet(*model, "unk_token")) {
    TANDEM_ASSIGN_OR_RETURN(const std::string unk, GetString(*model, "unk_token", model_where));
    const auto it = state->vocab.find(unk);
    if (it == state->vocab.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_where, ".unk_token '", unk, "' is not in the vocabulary"));
    }
    state->unk_id = it->second;
  }

  // Added tokens.
  struct Added {
    AddedToken token;
    bool special = false;
    bool normalized = false;
  };
  std::vector<Added> added;
  if (IsSet(json, "added_tokens")) {
    TANDEM_ASSIGN_OR_RETURN(const Json* list, GetArray(json, "added_tokens", where));
    for (size_t i = 0; i < list->size(); ++i) {
      const Json& entry = (*list)[i];
      const std::string entry_where = absl::StrCat(where, ": added_tokens[", i, "]");
      if (!entry.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(entry_where, ": expected an object"));
      }
      Added token;
      TANDEM_ASSIGN_OR_RETURN(token.token.content, GetString(entry, "content", entry_where));
      TANDEM_ASSIGN_OR_RETURN(token.token.id, GetInt(entry, "id", entry_where));
      if (token.token.content.empty() || token.token.id < 0 || token.token.id >= INT32_MAX) {
        return absl::InvalidArgumentError(
            absl::StrCat(entry_where, ": an empty content or an id outside [0, 2^31)"));
      }
      for (const char* option : {"single_word", "lstrip", "rstrip"}) {
        TANDEM_ASSIGN_OR_RETURN(const bool set, GetBoolOrUnset(entry, option, false, entry_where));
        if (set) {
          return Unsupported(
              source, absl::StrCat("the added token '", token.token.content, "' with ", option));
        }
      }
      TANDEM_ASSIGN_OR_RETURN(token.special, GetBoolOrUnset(entry, "special", false, entry_where));
      // `tokenizers` defaults to normalized for tokens that are not special.
      TANDEM_ASSIGN_OR_RETURN(token.normalized,
                              GetBoolOrUnset(entry, "normalized", !token.special, entry_where));
      largest = std::max(largest, token.token.id);
      added.push_back(std::move(token));
    }
  }

  state->byte_chars = ByteCharacters();
  for (int b = 0; b < 256; ++b) {
    AppendUtf8(state->byte_chars[b], &state->byte_char_text[b]);
    state->char_bytes[state->byte_chars[b]] = static_cast<unsigned char>(b);
  }
  const size_t size = static_cast<size_t>(largest + 1);
  state->tokens.assign(size, std::string());
  state->known.assign(size, false);
  state->special.assign(size, false);
  for (const auto& [token, id] : state->vocab) {
    state->tokens[id] = token;
    state->known[id] = true;
  }
  for (Added& token : added) {
    const int64_t id = token.token.id;
    state->tokens[id] = token.token.content;
    state->known[id] = true;
    state->special[id] = token.special;
    state->added_ids[token.token.content] = id;
    if (token.normalized) {
      // Matched in the normalized text, as the normalizer spells it.
      token.token.content = state->Normalize(token.token.content);
      if (token.token.content.empty()) continue;
      const unsigned char first = static_cast<unsigned char>(token.token.content[0]);
      state->normalized_tokens[first].push_back(token.token);
      state->any_normalized = true;
    } else {
      const unsigned char first = static_cast<unsigned char>(token.token.content[0]);
      state->plain_tokens[first].push_back(token.token);
      state->any_plain = true;
    }
  }

  // The post-processor: ByteLevel (offsets only), TemplateProcessing (its single-sequence
  // template, applied when special tokens are asked for), a Sequence of them, or none.
  if (IsSet(json, "post_processor")) {
    const std::string at = where + ": post_processor";
    TANDEM_ASSIGN_OR_RETURN(const std::vector<const Json*> steps,
                            Steps(json.at("post_processor"), "processors", at));
    for (const Json* step : steps) {
      const std::string step_type = TypeOf(*step);
      if (step_type == "ByteLevel") continue;
      if (step_type != "TemplateProcessing" || !state->single_template.empty()) {
        return Unsupported(source, absl::StrCat("the post-processor ", step_type));
      }
      TANDEM_ASSIGN_OR_RETURN(const Json* single, GetArray(*step, "single", at));
      TANDEM_ASSIGN_OR_RETURN(const Json* specials, GetObject(*step, "special_tokens", at));
      bool has_sequence = false;
      for (const Json& item : *single) {
        TemplateItem made;
        if (item.is_object() && item.contains("Sequence")) {
          const Json& sequence = item.at("Sequence");
          if (!sequence.is_object() || !sequence.contains("id") || sequence.at("id") != Json("A")) {
            return Unsupported(source, absl::StrCat("the template item ", item.dump()));
          }
          made.sequence = true;
          has_sequence = true;
        } else if (item.is_object() && item.contains("SpecialToken") &&
                   item.at("SpecialToken").is_object() && item.at("SpecialToken").contains("id") &&
                   item.at("SpecialToken").at("id").is_string()) {
          const std::string name = item.at("SpecialToken").at("id").get<std::string>();
          if (!specials->contains(name) || !specials->at(name).is_object()) {
            return absl::InvalidArgumentError(absl::StrCat(at, ": the template's special token '",
                                                           name, "' is not in special_tokens"));
          }
          TANDEM_ASSIGN_OR_RETURN(const Json* ids, GetArray(specials->at(name), "ids", at));
          for (const Json& id : *ids) {
            if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
                id.get<int64_t>() >= static_cast<int64_t>(size)) {
              return absl::InvalidArgumentError(absl::StrCat(at, ": the special token '", name,
                                                             "' has the id ", id.dump(),
                                                             ", outside the vocabulary"));
            }
            made.ids.push_back(id.get<int64_t>());
          }
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat(at, ": the template item ", item.dump(), " is not understood"));
        }
        state->single_template.push_back(std::move(made));
      }
      if (!has_sequence) {
        return absl::InvalidArgumentError(
            absl::StrCat(at, ": the single template has no $A (the text)"));
      }
    }
  }
  return Tokenizer(std::move(state));
}

absl::StatusOr<std::vector<int64_t>> Tokenizer::Encode(absl::string_view text,
                                                       bool add_special_tokens) const {
  const State& s = *state_;
  {
    std::vector<char32_t> codes;
    std::vector<size_t> offsets;
    TANDEM_RETURN_IF_ERROR(DecodeUtf8(text, &codes, &offsets));
  }
  // As `tokenizers`' AddedVocabulary::extract_and_normalize: added tokens that are not
  // normalized are found in the text as given; each part between them is normalized on its
  // own, and the normalized tokens are found in it.
  std::vector<Piece> plain, pieces;
  SplitAtTokens({std::string(text), -1, true}, s.plain_tokens, s.any_plain, &plain);
  for (Piece& piece : plain) {
    if (piece.id >= 0) {
      pieces.push_back(std::move(piece));
    } else {
      piece.text = s.Normalize(piece.text);
      SplitAtTokens(piece, s.normalized_tokens, s.any_normalized, &pieces);
    }
  }
  TANDEM_RETURN_IF_ERROR(s.PreTokenize(&pieces));
  std::vector<int64_t> ids;
  std::unordered_map<std::string, std::vector<int64_t>> cache;  // piece -> ids, this call
  for (const Piece& piece : pieces) {
    if (piece.id >= 0) {
      ids.push_back(piece.id);
      continue;
    }
    auto [it, inserted] = cache.try_emplace(piece.text);
    if (inserted) s.EncodeWord(piece.text, &it->second);
    ids.insert(ids.end(), it->second.begin(), it->second.end());
  }
  if (!add_special_tokens || s.single_template.empty()) return ids;
  std::vector<int64_t> templated;
  for (const TemplateItem& item : s.single_template) {
    const std::vector<int64_t>& part = item.sequence ? ids : item.ids;
    templated.insert(templated.end(), part.begin(), part.end());
  }
  return templated;
}

std::string Tokenizer::Decode(absl::Span<const int64_t> ids, bool skip_special_tokens) const {
  const State& s = *state_;
  std::vector<std::string> tokens;
  for (const int64_t id : ids) {
    if (id < 0 || id >= static_cast<int64_t>(s.tokens.size()) || !s.known[id]) continue;
    if (skip_special_tokens && s.special[id]) continue;
    tokens.push_back(s.tokens[id]);
  }
  if (!s.has_decoder) return absl::StrJoin(tokens, " ");
  return absl::StrJoin(s.DecodeChain(std::move(tokens)), "");
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(state_->tokens.size()); }

std::optional<int64_t> Tokenizer::TokenId(absl::string_view token) const {
  const std::string key(token);
  if (auto it = state_->added_ids.find(key); it != state_->added_ids.end()) return it->second;
  if (auto it = state_->vocab.find(key); it != state_->vocab.end()) return it->second;
  return std::nullopt;
}

bool Tokenizer::AddsSpecialTokens() const { return !state_->single_template.empty(); }

const std::string& Tokenizer::source() const { return state_->source; }

}  // namespace tandem::data
