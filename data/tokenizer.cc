#include "data/tokenizer.h"

#include <array>
#include <climits>
#include <unordered_map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "common/status.h"
#include "data/internal/unicode_classes.h"

namespace tandem::data {
namespace {

using internal::IsUnicodeLetter;
using internal::IsUnicodeNumber;
using internal::IsUnicodeWhiteSpace;

void AppendUtf8(char32_t code, std::string* out) {
  if (code < 0x80) {
    out->push_back(static_cast<char>(code));
  } else if (code < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (code >> 6)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else if (code < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (code >> 12)));
    out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (code >> 18)));
    out->push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  }
}

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

struct AddedToken {
  std::string content;
  int64_t id = 0;
};

// A piece of the text: an added token (id >= 0) or text to pre-tokenize (id < 0).
struct Segment {
  absl::string_view text;
  int64_t id = -1;
};

// Splits `text` at the leftmost-longest occurrences of `tokens` (bucketed by first byte).
void SplitAtTokens(absl::string_view text,
                   const std::array<std::vector<AddedToken>, 256>& tokens, bool any,
                   std::vector<Segment>* out) {
  if (!any) {
    if (!text.empty()) out->push_back({text, -1});
    return;
  }
  size_t from = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* best = nullptr;
    for (const AddedToken& token : tokens[static_cast<unsigned char>(text[i])]) {
      if ((best == nullptr || token.content.size() > best->content.size()) &&
          absl::StartsWith(text.substr(i), token.content)) {
        best = &token;
      }
    }
    if (best == nullptr) {
      ++i;
      continue;
    }
    if (i > from) out->push_back({text.substr(from, i - from), -1});
    out->push_back({text.substr(i, best->content.size()), best->id});
    i += best->content.size();
    from = i;
  }
  if (from < text.size()) out->push_back({text.substr(from), -1});
}

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
         static_cast<uint32_t>(right);
}

}  // namespace

struct Tokenizer::State {
  std::string source;
  std::unordered_map<std::string, int32_t> vocab;  // the model's: byte-level spelling -> id
  struct Merge {
    int32_t rank = 0;
    int32_t id = 0;  // of the merged token
  };
  std::unordered_map<uint64_t, Merge> merges;  // PairKey(left, right) ->
  int32_t unk_id = -1;
  bool fuse_unk = false;
  bool ignore_merges = false;
  bool add_prefix_space = false;
  bool use_regex = true;
  std::array<std::vector<AddedToken>, 256> special_tokens, other_tokens;  // by first byte
  bool any_special = false, any_other = false;
  std::unordered_map<std::string, int64_t> added_ids;
  // By id: the token text decoding starts from (an added token's content over the model's),
  // whether there is one, whether it is a special added token.
  std::vector<std::string> tokens;
  std::vector<bool> known, special;
  std::array<char32_t, 256> byte_chars{};
  std::array<std::string, 256> byte_char_text;  // byte_chars as UTF-8
  std::unordered_map<char32_t, unsigned char> char_bytes;

  void EncodeWord(absl::string_view bytes, std::vector<int64_t>* ids) const;
};

void Tokenizer::State::EncodeWord(absl::string_view bytes, std::vector<int64_t>* ids) const {
  std::string word;
  for (char b : bytes) word += byte_char_text[static_cast<unsigned char>(b)];
  if (ignore_merges) {
    auto it = vocab.find(word);
    if (it != vocab.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(bytes.size());
  bool last_unknown = false;
  for (char b : bytes) {
    auto it = vocab.find(byte_char_text[static_cast<unsigned char>(b)]);
    if (it != vocab.end()) {
      symbols.push_back(it->second);
      last_unknown = false;
    } else if (unk_id >= 0) {
      if (!(fuse_unk && last_unknown)) symbols.push_back(unk_id);
      last_unknown = true;
    }
  }
  // The pair of the lowest rank first (the leftmost of equals), one at a time, as `tokenizers`'
  // queue of pairs merges them.
  while (symbols.size() > 1) {
    int32_t best_rank = INT32_MAX;
    size_t best = 0;
    int32_t merged = 0;
    for (size_t k = 0; k + 1 < symbols.size(); ++k) {
      auto it = merges.find(PairKey(symbols[k], symbols[k + 1]));
      if (it != merges.end() && it->second.rank < best_rank) {
        best_rank = it->second.rank;
        best = k;
        merged = it->second.id;
      }
    }
    if (best_rank == INT32_MAX) break;
    symbols[best] = merged;
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  ids->insert(ids->end(), symbols.begin(), symbols.end());
}

namespace {

// InvalidArgument "SOURCE: WHAT is not supported (WHY)".
absl::Status Unsupported(absl::string_view source, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      source, ": ", what,
      " is not supported (tandem reads byte-level BPE tokenizers: a BPE model, the ByteLevel "
      "pre-tokenizer and decoder, no normalizer; see data/tokenizer.h)"));
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

  // Parts that would change the ids and that tandem does not implement.
  if (!IsNullOr(json, "normalizer", Json())) {
    return Unsupported(source, absl::StrCat("the normalizer ", TypeOf(json.at("normalizer"))));
  }
  if (!IsNullOr(json, "truncation", Json())) return Unsupported(source, "truncation");
  if (!IsNullOr(json, "padding", Json())) return Unsupported(source, "padding");
  if (!IsSet(json, "pre_tokenizer")) {
    return Unsupported(source, "a tokenizer without a pre-tokenizer");
  }
  const Json& pre = json.at("pre_tokenizer");
  if (TypeOf(pre) != "ByteLevel") {
    return Unsupported(source, absl::StrCat("the pre-tokenizer ", TypeOf(pre)));
  }
  TANDEM_ASSIGN_OR_RETURN(state->add_prefix_space,
                          GetBoolOrUnset(pre, "add_prefix_space", true, where + ": pre_tokenizer"));
  TANDEM_ASSIGN_OR_RETURN(state->use_regex,
                          GetBoolOrUnset(pre, "use_regex", true, where + ": pre_tokenizer"));
  if (!IsSet(json, "decoder")) {
    return Unsupported(source, "a tokenizer without a decoder (ByteLevel is needed)");
  }
  if (TypeOf(json.at("decoder")) != "ByteLevel") {
    return Unsupported(source, absl::StrCat("the decoder ", TypeOf(json.at("decoder"))));
  }
  if (IsSet(json, "post_processor") && TypeOf(json.at("post_processor")) != "ByteLevel") {
    return Unsupported(source,
                       absl::StrCat("the post-processor ", TypeOf(json.at("post_processor"))));
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
  TANDEM_ASSIGN_OR_RETURN(const bool byte_fallback,
                          GetBoolOrUnset(*model, "byte_fallback", false, model_where));
  if (byte_fallback) return Unsupported(source, "byte_fallback");
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
  std::vector<std::pair<AddedToken, bool>> added;
  if (IsSet(json, "added_tokens")) {
    TANDEM_ASSIGN_OR_RETURN(const Json* list, GetArray(json, "added_tokens", where));
    for (size_t i = 0; i < list->size(); ++i) {
      const Json& entry = (*list)[i];
      const std::string entry_where = absl::StrCat(where, ": added_tokens[", i, "]");
      if (!entry.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(entry_where, ": expected an object"));
      }
      AddedToken token;
      TANDEM_ASSIGN_OR_RETURN(token.content, GetString(entry, "content", entry_where));
      TANDEM_ASSIGN_OR_RETURN(token.id, GetInt(entry, "id", entry_where));
      if (token.content.empty() || token.id < 0 || token.id >= INT32_MAX) {
        return absl::InvalidArgumentError(
            absl::StrCat(entry_where, ": an empty content or an id outside [0, 2^31)"));
      }
      for (const char* option : {"single_word", "lstrip", "rstrip"}) {
        TANDEM_ASSIGN_OR_RETURN(const bool set, GetBoolOrUnset(entry, option, false, entry_where));
        if (set) {
          return Unsupported(source,
                             absl::StrCat("the added token '", token.content, "' with ", option));
        }
      }
      TANDEM_ASSIGN_OR_RETURN(const bool special,
                              GetBoolOrUnset(entry, "special", false, entry_where));
      largest = std::max(largest, token.id);
      added.emplace_back(std::move(token), special);
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
  for (auto& [token, special] : added) {
    state->tokens[token.id] = token.content;
    state->known[token.id] = true;
    state->special[token.id] = special;
    state->added_ids[token.content] = token.id;
    const unsigned char first = static_cast<unsigned char>(token.content[0]);
    if (special) {
      state->special_tokens[first].push_back(token);
      state->any_special = true;
    } else {
      state->other_tokens[first].push_back(token);
      state->any_other = true;
    }
  }
  return Tokenizer(std::move(state));
}

absl::StatusOr<std::vector<int64_t>> Tokenizer::Encode(absl::string_view text) const {
  const State& s = *state_;
  std::vector<char32_t> codes;
  std::vector<size_t> offsets;
  TANDEM_RETURN_IF_ERROR(DecodeUtf8(text, &codes, &offsets));
  // Special added tokens first, then the others in the text between them.
  std::vector<Segment> first, segments;
  SplitAtTokens(text, s.special_tokens, s.any_special, &first);
  for (const Segment& segment : first) {
    if (segment.id >= 0) {
      segments.push_back(segment);
    } else {
      SplitAtTokens(segment.text, s.other_tokens, s.any_other, &segments);
    }
  }
  std::vector<int64_t> ids;
  std::unordered_map<std::string, std::vector<int64_t>> cache;  // piece -> ids, this call
  std::vector<CharClass> classes;
  std::vector<int64_t> word;
  for (const Segment& segment : segments) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    std::string prefixed;
    absl::string_view piece_text = segment.text;
    if (s.add_prefix_space && !absl::StartsWith(piece_text, " ")) {
      prefixed = absl::StrCat(" ", piece_text);
      piece_text = prefixed;
    }
    std::vector<absl::string_view> pieces;
    if (s.use_regex) {
      TANDEM_RETURN_IF_ERROR(DecodeUtf8(piece_text, &codes, &offsets));
      classes.resize(codes.size());
      for (size_t i = 0; i < codes.size(); ++i) classes[i] = Classify(codes[i]);
      for (size_t i = 0; i < codes.size();) {
        const size_t end = MatchGpt2Piece(codes, classes, i);
        pieces.push_back(piece_text.substr(offsets[i], offsets[end] - offsets[i]));
        i = end;
      }
    } else {
      pieces.push_back(piece_text);
    }
    for (absl::string_view piece : pieces) {
      auto [it, inserted] = cache.try_emplace(std::string(piece));
      if (inserted) s.EncodeWord(piece, &it->second);
      ids.insert(ids.end(), it->second.begin(), it->second.end());
    }
  }
  return ids;
}

std::string Tokenizer::Decode(absl::Span<const int64_t> ids, bool skip_special_tokens) const {
  const State& s = *state_;
  std::string bytes;
  std::vector<char32_t> codes;
  std::vector<size_t> offsets;
  for (const int64_t id : ids) {
    if (id < 0 || id >= static_cast<int64_t>(s.tokens.size()) || !s.known[id]) continue;
    if (skip_special_tokens && s.special[id]) continue;
    const std::string& token = s.tokens[id];
    // ByteLevel: each character back to its byte; a token with a character that stands for
    // no byte is taken as it is.
    bool all_bytes = DecodeUtf8(token, &codes, &offsets).ok();
    std::string token_bytes;
    for (size_t i = 0; all_bytes && i < codes.size(); ++i) {
      auto it = s.char_bytes.find(codes[i]);
      if (it == s.char_bytes.end()) {
        all_bytes = false;
      } else {
        token_bytes.push_back(static_cast<char>(it->second));
      }
    }
    bytes += all_bytes ? token_bytes : token;
  }
  return LossyUtf8(bytes);
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(state_->tokens.size()); }

std::optional<int64_t> Tokenizer::TokenId(absl::string_view token) const {
  const std::string key(token);
  if (auto it = state_->added_ids.find(key); it != state_->added_ids.end()) return it->second;
  if (auto it = state_->vocab.find(key); it != state_->vocab.end()) return it->second;
  return std::nullopt;
}

const std::string& Tokenizer::source() const { return state_->source; }

}  // namespace tandem::data
