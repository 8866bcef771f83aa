// data/tokenizer.h against Hugging Face `tokenizers`: tokenizer_reference.py trains byte-level
// BPE tokenizers on real text (this repository's documentation and, where present, Debian's
// GPL-3 text) with scripts/prepare_data.py and in the layouts of GPT-2, Llama 2 and 3, Qwen2
// and Gemma (and Split by a string with each behavior), and encodes and decodes with them; the C++
// tokenizer must give the same ids for every text (real text and a text of Unicode corner cases),
// the same text back for those ids and for random id sequences (broken UTF-8 included), and
// decode(encode(x)) == x. Skipped, with the reason, where python3 cannot import tokenizers.
// Refusals and bad input are checked without Python.
#include "data/tokenizer.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/json_util.h"
#include "data/internal/unicode_nfc.h"
#include "data/internal/utf8.h"
#include "gtest/gtest.h"
#include "tests/support/command.h"

namespace tandem::data {
namespace {

namespace fs = std::filesystem;
using internal::AppendUtf8;
using testing::Outcome;
using testing::RunCommand;

const std::string kScript = std::string(TANDEM_TOKENS_TEST_DIR) + "/tokenizer_reference.py";
const std::string kRepository = std::string(TANDEM_TOKENS_TEST_DIR) + "/../..";

// Corner cases of GPT-2's pattern and of UTF-8: contractions (and upper-case ones, which the
// pattern does not take), runs of spaces before words and at the end, every kind of white
// space (U+001C is Python's but not Unicode's), numbers of every category, marks, emoji with
// joiners, scripts without spaces, added tokens inside words.
constexpr char kCornerCases[] =
    "I'm sure they'll say we've done it; she'd know it's DON'T 'tis o'clock ''s 'x\n"
    "  two spaces   three\tand a tab \t\tthen\r\nWindows lines\n\n\nblank lines   \n"
    "numbers 12345 3.14159 1,000,000 \xC2\xBD \xC2\xB2 \xE2\x85\xAB \xD9\xA3\xD9\xA4 007\n"
    "caf\xC3\xA9 cafe\xCC\x81 na\xC3\xAFve \xC3\xBC"
    "ber \xE6\x9D\xB1\xE4\xBA\xAC\xE3\x82\xBF"
    "\xE3\x83\xAF\xE3\x83\xBC \xD0\x9C\xD0\xBE\xD1\x81\xD0\xBA\xD0\xB2\xD0\xB0 "
    "\xD8\xA7\xD9\x84\xD8\xB9\xD8\xB1\xD8\xA8\xD9\x8A\xD8\xA9\n"
    "emoji \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2"
    "\x80\x8D\xF0\x9F\x91\xA7 zero\xE2\x80\x8Bwidth\n"
    "spaces: nbsp\xC2\xA0here ideographic\xE3\x80\x80here nel\xC2\x85here ls\xE2\x80\xA8here "
    "fs\x1Chere vt\x0B"
    "ff\x0Chere em\xE2\x80\x83space\n"
    "added<|endoftext|>tokens<sep>inside <|endoftext|> and <sep> <|endoftext|><|endoftext|>\n"
    "punctuation!!! ... --- (brackets) [x] {y} \"quotes\" \xE2\x80\x9Csmart\xE2\x80\x9D "
    "\xE2\x80\x94 dash \xEF\xBF\xBD replacement\n"
    "llama: <s>begins</s> <|begin_of_text|>x WE'RE 'Ll 'VE 'M 'D\t\tword .\n\n  \r\n\t "
    "1234567 ?!\r\n\r\n x\n"
    "nfc: \xE2\x84\xAB \xE2\x84\xA6 e\xCC\x81\xCC\xA3 \xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8 "
    "\xE0\xA5\x98 a\xCC\xA3\xCC\x82 \xE1\xB8\x8B\xCC\xA3 \xEA\xB0\x80\xE1\x86\xA8\n"
    "trailing spaces at the very end   ";

std::string Python() { return "python3"; }

// A fresh folder for the test binary's files, removed at exit.
const std::string& Scratch() {
  static const std::string* path = [] {
    auto* made = new std::string(
        (fs::temp_directory_path() / absl::StrCat("tandem_tokenizer_test_", ::getpid()))
            .string());
    fs::remove_all(*made);
    fs::create_directories(*made);
    std::atexit([] { fs::remove_all(Scratch()); });
    return made;
  }();
  return *path;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string ReadText(const std::string& path) {
  auto text = ReadFile(path);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : std::string();
}

// The real texts: the repository's documentation (English with some Unicode) and Debian's
// GPL-3 where present; then the corner cases.
std::vector<std::string> Texts() {
  std::vector<std::string> texts;
  for (const char* name : {"README.md", "docs/data.md", "docs/planner.md", "docs/elastic.md",
                           "docs/pipeline.md", "docs/checkpoints.md"}) {
    const std::string path = absl::StrCat(kRepository, "/", name);
    if (fs::exists(path)) texts.push_back(path);
  }
  if (fs::exists("/usr/share/common-licenses/GPL-3")) {
    texts.push_back("/usr/share/common-licenses/GPL-3");
  }
  const std::string corner = Scratch() + "/corner_cases.txt";
  WriteText(corner, kCornerCases);
  texts.push_back(corner);
  // A text that starts with added tokens (no prefix before what follows them where the
  // Metaspace scheme is "first") and one of spaces only.
  const std::string leading = Scratch() + "/leading_token.txt";
  WriteText(leading, "<s><|endoftext|> Hello <sep>world</s>\n<|begin_of_text|>  x ");
  texts.push_back(leading);
  const std::string spaces = Scratch() + "/spaces.txt";
  WriteText(spaces, "   ");
  texts.push_back(spaces);
  return texts;
}

struct Reference {
  std::vector<std::string> tokenizers;  // tokenizer.json paths
  std::string unavailable;              // non-empty: skip, with this reason
  std::string failed;                   // non-empty: the script failed
};

const Reference& References() {
  static const Reference* reference = [] {
    auto* made = new Reference;
    const Outcome probe = RunCommand(Python() + " -c 'import tokenizers, numpy'");
    if (probe.exit_status != 0) {
      made->unavailable = absl::StrCat(
          "python3 cannot import tokenizers and numpy (scripts/python_env.sh installs them): ",
          probe.output.substr(0, 300));
      return made;
    }
    std::string command = absl::StrCat(Python(), " '", kScript, "' make '", Scratch(), "/made'");
    for (const std::string& text : Texts()) absl::StrAppend(&command, " '", text, "'");
    const Outcome made_files = RunCommand(command);
    if (made_files.exit_status != 0) {
      made->failed = absl::StrCat("tokenizer_reference.py make failed (exit ",
                                  made_files.exit_status, "): ", made_files.output);
      return made;
    }
    for (absl::string_view line : absl::StrSplit(made_files.output, '\n')) {
      if (absl::EndsWith(line, ".json")) made->tokenizers.emplace_back(line);
    }
    if (made->tokenizers.size() != 14) {
      made->failed = "expected fourteen tokenizers: " + made_files.output;
    }
    return made;
  }();
  return *reference;
}

#define REQUIRE_REFERENCE()                                        \
  do {                                                             \
    const Reference& ref = References();                           \
    if (!ref.unavailable.empty()) GTEST_SKIP() << ref.unavailable; \
    ASSERT_TRUE(ref.failed.empty()) << ref.failed;                 \
  } while (false)

// What Python's `tokenizers` makes of `texts` and `id_lists` with `tokenizer`.
Json RunReference(const std::string& tokenizer, const std::vector<std::string>& texts,
                  const std::vector<std::vector<int64_t>>& id_lists) {
  const std::string request = Scratch() + "/request.json";
  const std::string output = Scratch() + "/output.json";
  WriteText(request, Json{{"texts", texts}, {"id_lists", id_lists}}.dump());
  const Outcome run = RunCommand(absl::StrCat(Python(), " '", kScript, "' run '", tokenizer,
                                              "' '", request, "' '", output, "'"));
  EXPECT_EQ(run.exit_status, 0) << run.output;
  auto json = ReadJsonFile(output);
  EXPECT_TRUE(json.ok()) << json.status();
  return json.ok() ? *json : Json();
}

// The index and values around the first difference, for a readable failure.
std::string FirstDifference(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  const auto around = [i](const std::vector<int64_t>& v) {
    std::string text;
    for (size_t k = i >= 3 ? i - 3 : 0; k < v.size() && k < i + 4; ++k) {
      absl::StrAppend(&text, k == i ? "[" : "", v[k], k == i ? "] " : " ");
    }
    return text;
  };
  return absl::StrCat("sizes ", a.size(), " and ", b.size(), "; first difference at ", i,
                      ": tandem ", around(a), "| tokenizers ", around(b));
}

TEST(TokenizerTest, EncodesAndDecodesAsHuggingFaceTokenizers) {
  REQUIRE_REFERENCE();
  const std::vector<std::string> texts = Texts();
  for (const std::string& path : References().tokenizers) {
    SCOPED_TRACE(path);
    auto tokenizer = Tokenizer::FromFile(path);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    // Random ids over the whole vocabulary: byte tokens that break UTF-8 among them.
    std::mt19937_64 random(11);
    std::vector<std::vector<int64_t>> id_lists;
    for (int list = 0; list < 40; ++list) {
      std::vector<int64_t> ids(1 + random() % 30);
      for (int64_t& id : ids) id = static_cast<int64_t>(random() % tokenizer->vocab_size());
      id_lists.push_back(ids);
    }
    const Json reference = RunReference(path, texts, id_lists);
    ASSERT_EQ(reference["encodings"].size(), texts.size());
    // Byte-level BPE without a prefix space loses nothing.
    const bool lossless =
        absl::StrContains(path, "prepared") || absl::StrContains(path, "llama3_style");
    int64_t tokens = 0;
    for (size_t t = 0; t < texts.size(); ++t) {
      SCOPED_TRACE(texts[t]);
      const std::string text = ReadText(texts[t]);
      auto ids = tokenizer->Encode(text);
      ASSERT_TRUE(ids.ok()) << ids.status();
      const std::vector<int64_t> expected =
          reference["encodings"][t]["ids"].get<std::vector<int64_t>>();
      ASSERT_EQ(*ids, expected) << FirstDifference(*ids, expected);
      tokens += static_cast<int64_t>(ids->size());
      auto with_special = tokenizer->Encode(text, /*add_special_tokens=*/true);
      ASSERT_TRUE(with_special.ok()) << with_special.status();
      const std::vector<int64_t> expected_special =
          reference["encodings"][t]["ids_special"].get<std::vector<int64_t>>();
      EXPECT_EQ(*with_special, expected_special)
          << FirstDifference(*with_special, expected_special);
      EXPECT_EQ(tokenizer->AddsSpecialTokens(), expected_special != expected);
      EXPECT_EQ(tokenizer->Decode(*ids), reference["encodings"][t]["decoded"].get<std::string>());
      EXPECT_EQ(tokenizer->Decode(*ids, /*skip_special_tokens=*/true),
                reference["encodings"][t]["decoded_skip"].get<std::string>());
      // (add_prefix_space, Prepend and Metaspace add a space before each piece between added
      // tokens, and a small alphabet loses characters: Python's decode above checks those.)
      if (lossless) EXPECT_EQ(tokenizer->Decode(*ids), text);
    }
    EXPECT_GT(tokens, 10000) << "too little text compared";
    for (size_t l = 0; l < id_lists.size(); ++l) {
      EXPECT_EQ(tokenizer->Decode(id_lists[l]),
                reference["decodings"][l]["decoded"].get<std::string>())
          << "id list " << l;
      EXPECT_EQ(tokenizer->Decode(id_lists[l], /*skip_special_tokens=*/true),
                reference["decodings"][l]["decoded_skip"].get<std::string>())
          << "id list " << l;
    }
  }
}

// The NFC normalizer (data/internal/unicode_nfc.h) against Python's unicodedata, whose tables
// made it: every code point alone, every code point after a letter, every primary composite's
// two parts in order and with a mark between them of each kind (blocking or not), and marks in
// every order after a letter.
TEST(TokenizerTest, NfcEqualsPythonsUnicodedata) {
  REQUIRE_REFERENCE();
  std::vector<std::vector<char32_t>> lines;
  for (char32_t code = 1; code < 0x110000; ++code) {
    if ((code >= 0xD800 && code <= 0xDFFF) || code == '\n') continue;
    lines.push_back({code});
    lines.push_back({'a', code});
  }
  const std::vector<char32_t> marks = {0x301, 0x323, 0x302, 0x308, 0x31B,  0x327,
                                       0x334, 0x345, 0x5B0, 0x93C, 0x3099, 0x1D16E};
  for (size_t k = 0; k < internal::kCompositionCount; ++k) {
    const internal::Composition& c = internal::kCompositions[k];
    lines.push_back({c.first, c.second});
    for (const char32_t mark : marks) lines.push_back({c.first, mark, c.second});
  }
  for (const char32_t a : marks) {
    for (const char32_t b : marks) {
      for (const char32_t base : {U'a', U'e', U'o', U'u', U'\x1100', U'\xAC00', U'\x3B1'}) {
        lines.push_back({base, a, b});
      }
    }
  }
  std::string text;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) text.push_back('\n');
    for (const char32_t code : lines[i]) AppendUtf8(code, &text);
  }
  const std::string in = Scratch() + "/nfc_in.txt", out = Scratch() + "/nfc_out.txt";
  WriteText(in, text);
  const Outcome run =
      RunCommand(absl::StrCat(Python(), " '", kScript, "' nfc '", in, "' '", out, "'"));
  ASSERT_EQ(run.exit_status, 0) << run.output;
  const std::vector<std::string> expected = absl::StrSplit(ReadText(out), '\n');
  ASSERT_EQ(expected.size(), lines.size());
  int differences = 0;
  for (size_t i = 0; i < lines.size() && differences < 10; ++i) {
    std::vector<char32_t> codes = lines[i];
    internal::ToNfc(&codes);
    std::string mine;
    for (const char32_t code : codes) AppendUtf8(code, &mine);
    if (mine != expected[i]) {
      ++differences;
      ADD_FAILURE() << "line " << i << " (U+" << absl::StrFormat("%04X", lines[i][0])
                    << "...): tandem '" << mine << "', Python '" << expected[i] << "'";
    }
  }
}

TEST(TokenizerTest, ReadsMergesAsStringsAndAsPairs) {
  REQUIRE_REFERENCE();
  // `tokenizers` up to 0.19 wrote each merge as "a b", later ones as ["a", "b"]: the same
  // tokenizer either way.
  const std::string path = References().tokenizers[1];
  auto json = ReadJsonFile(path);
  ASSERT_TRUE(json.ok()) << json.status();
  Json& merges = (*json)["model"]["merges"];
  ASSERT_FALSE(merges.empty());
  const bool pairs = merges[0].is_array();
  for (Json& merge : merges) {
    if (pairs) {
      merge = absl::StrCat(merge[0].get<std::string>(), " ", merge[1].get<std::string>());
    } else {
      const std::string line = merge.get<std::string>();
      const size_t space = line.find(' ');
      merge = Json::array({line.substr(0, space), line.substr(space + 1)});
    }
  }
  auto converted = Tokenizer::FromJson(json->dump(), "converted.json");
  auto original = Tokenizer::FromFile(path);
  ASSERT_TRUE(converted.ok()) << converted.status();
  ASSERT_TRUE(original.ok()) << original.status();
  const std::string text = ReadText(absl::StrCat(kRepository, "/README.md"));
  auto a = converted->Encode(text);
  auto b = original->Encode(text);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_GT(a->size(), 1000u);
}

// ---- Without Python ---------------------------------------------------------------------------

// A minimal byte-level tokenizer.json: the 256 byte characters, `merges` and their results, an
// end-of-text token; `edit` changes the JSON before it is read.
std::string MinimalTokenizer(const std::vector<std::pair<std::string, std::string>>& merges,
                             const std::function<void(Json&)>& edit = {}) {
  Json vocab = Json::object();
  int64_t next = 0;
  vocab["<|endoftext|>"] = next++;
  int extra = 0;  // GPT-2's bytes_to_unicode: unprintable bytes from U+0100 on
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const char32_t code = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
    std::string utf8;
    if (code < 0x80) {
      utf8.push_back(static_cast<char>(code));
    } else {
      utf8.push_back(static_cast<char>(0xC0 | (code >> 6)));
      utf8.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
    vocab[utf8] = next++;
  }
  Json merge_list = Json::array();
  for (const auto& [a, b] : merges) {
    merge_list.push_back(a + " " + b);
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
  }
  Json json = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       Json::array({{{"id", 0}, {"content", "<|endoftext|>"}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                     {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
        {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
        {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
        {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", merge_list}}}};
  if (edit) edit(json);
  return json.dump();
}

TEST(TokenizerTest, MergesStayInsidePreTokenizedPieces) {
  // "d" + "Ġ" would merge across " w"'s boundary if the text were not split first; "Ġ" + "w"
  // is inside a piece.
  auto tokenizer = Tokenizer::FromJson(
      MinimalTokenizer({{"d", "\xC4\xA0"}, {"\xC4\xA0", "w"}, {"o", "r"}}), "minimal.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const int64_t space_w = *tokenizer->TokenId("\xC4\xA0w");
  const int64_t d = *tokenizer->TokenId("d");
  const int64_t o_r = *tokenizer->TokenId("or");
  auto ids = tokenizer->Encode("d word");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int64_t>{d, space_w, o_r, d}));
  EXPECT_EQ(tokenizer->Decode(*ids), "d word");
  // The special token is one id wherever it stands.
  auto with_eos = tokenizer->Encode("d<|endoftext|>d");
  ASSERT_TRUE(with_eos.ok());
  EXPECT_EQ(*with_eos, (std::vector<int64_t>{d, 0, d}));
  EXPECT_EQ(tokenizer->Decode(*with_eos, /*skip_special_tokens=*/true), "dd");
  EXPECT_EQ(tokenizer->vocab_size(), 1 + 256 + 3);
}

TEST(TokenizerTest, DecodesBrokenUtf8AsReplacementCharacters) {
  auto tokenizer = Tokenizer::FromJson(MinimalTokenizer({}), "minimal.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  // Byte b's id is b + 1 here when b is printable ASCII; look the others up by encoding.
  auto e_acute = tokenizer->Encode("\xC3\xA9");  // two byte tokens
  ASSERT_TRUE(e_acute.ok());
  ASSERT_EQ(e_acute->size(), 2u);
  EXPECT_EQ(tokenizer->Decode({(*e_acute)[0]}), "\xEF\xBF\xBD");
  EXPECT_EQ(tokenizer->Decode({(*e_acute)[0], (*e_acute)[1]}), "\xC3\xA9");
  const int64_t a = *tokenizer->TokenId("a");
  EXPECT_EQ(tokenizer->Decode({(*e_acute)[0], a}), "\xEF\xBF\xBD" "a");
  // Ids without a token are skipped.
  EXPECT_EQ(tokenizer->Decode({a, 100000, -1, a}), "aa");
}

TEST(TokenizerTest, RefusesWhatItDoesNotImplement) {
  struct Case {
    const char* what;  // the message must name it
    std::function<void(Json&)> edit;
  };
  const std::vector<Case> cases = {
      {"model type Unigram", [](Json& j) { j["model"]["type"] = "Unigram"; }},
      {"model type WordPiece", [](Json& j) { j["model"]["type"] = "WordPiece"; }},
      {"normalizer NFKC",
       [](Json& j) {
         j["normalizer"] = {{"type", "NFKC"}};
       }},
      {"normalizer Lowercase",
       [](Json& j) {
         j["normalizer"] = {
             {"type", "Sequence"},
             {"normalizers", {{{"type", "Prepend"}, {"prepend", "_"}}, {{"type", "Lowercase"}}}}};
       }},
      {"Replace with the pattern",
       [](Json& j) {
         j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "_"}};
       }},
      {"pre-tokenizer Whitespace",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       }},
      {"Split pre-tokenizer's pattern",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers",
                                {{{"type", "Split"},
                                  {"pattern", {{"Regex", "\\d+"}}},
                                  {"behavior", "Isolated"},
                                  {"invert", false}}}}};
       }},
      {"behavior 'Removed'",
       [](Json& j) {
         j["pre_tokenizer"] = {
             {"type", "Split"},
             {"pattern",
              {{"Regex", j["pre_tokenizer"].is_null() ? ""
                                                      : "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| "
                                                        "?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
                                                        "\\s+(?!\\S)|\\s+"}}},
             {"behavior", "Removed"},
             {"invert", false}};
       }},
      {"inverted",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Split"},
                               {"pattern", {{"String", " "}}},
                               {"behavior", "MergedWithPrevious"},
                               {"invert", true}};
       }},
      {"behavior 'Merged'",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Split"},
                               {"pattern", {{"String", " "}}},
                               {"behavior", "Merged"},
                               {"invert", false}};
       }},
      {"decoder WordPiece",
       [](Json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       }},
      {"post-processor BertProcessing",
       [](Json& j) {
         j["post_processor"] = {{"type", "BertProcessing"}};
       }},
      {"BPE dropout", [](Json& j) { j["model"]["dropout"] = 0.1; }},
      {"continuing_subword_prefix",
       [](Json& j) { j["model"]["continuing_subword_prefix"] = "##"; }},
      {"lstrip", [](Json& j) { j["added_tokens"][0]["lstrip"] = true; }},
      {"truncation",
       [](Json& j) {
         j["truncation"] = {{"max_length", 8}};
       }},
  };
  for (const Case& c : cases) {
    auto tokenizer = Tokenizer::FromJson(MinimalTokenizer({}, c.edit), "bad.json");
    ASSERT_FALSE(tokenizer.ok()) << c.what;
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_TRUE(absl::StrContains(tokenizer.status().message(), c.what))
        << c.what << ": " << tokenizer.status();
    EXPECT_TRUE(absl::StrContains(tokenizer.status().message(), "bad.json"))
        << tokenizer.status();
  }
}

TEST(TokenizerTest, BadInput) {
  EXPECT_EQ(Tokenizer::FromFile("/nonexistent/tokenizer.json").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Tokenizer::FromJson("{not json", "x.json").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromJson("[]", "x.json").status().code(),
            absl::StatusCode::kInvalidArgument);
  // A merge whose result is not in the vocabulary.
  auto missing = Tokenizer::FromJson(
      MinimalTokenizer({}, [](Json& j) { j["model"]["merges"] = {"q z"}; }), "x.json");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  // Malformed parts of the normalizer, pre-tokenizer, decoder and template: each one line
  // naming the file.
  const std::vector<std::function<void(Json&)>> malformed = {
      [](Json& j) {
        j["normalizer"] = {{"type", "Sequence"}, {"normalizers", 3}};
      },
      [](Json& j) {
        j["normalizer"] = {{"type", "Prepend"}};
      },
      [](Json& j) {
        j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", ""}}}, {"content", "x"}};
      },
      [](Json& j) {
        j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}};
      },
      [](Json& j) {
        j["pre_tokenizer"] = {
            {"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "sometimes"}};
      },
      [](Json& j) {
        j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", 7}};
      },
      [](Json& j) {
        j["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", -1}, {"stop", 0}};
      },
      [](Json& j) {
        j["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", 1}}}}};
      },
      [](Json& j) {
        j["post_processor"] = {
            {"type", "TemplateProcessing"},
            {"single", {{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", 5}}}}}},
            {"special_tokens", Json::object()}};
      },
      [](Json& j) {
        j["post_processor"] = {
            {"type", "TemplateProcessing"},
            {"single", {{{"SpecialToken", {{"id", "<s>"}}}}}},
            {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {0}}, {"tokens", {"<s>"}}}}}}};
      },
      [](Json& j) {
        j["post_processor"] = {
            {"type", "TemplateProcessing"},
            {"single", {{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
            {"special_tokens",
             {{"<s>", {{"id", "<s>"}, {"ids", {1 << 30}}, {"tokens", {"<s>"}}}}}}};
      },
  };
  for (size_t k = 0; k < malformed.size(); ++k) {
    auto bad = Tokenizer::FromJson(MinimalTokenizer({}, malformed[k]), "bad.json");
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << k;
    EXPECT_TRUE(absl::StrContains(bad.status().message(), "bad.json")) << k << bad.status();
  }
  auto tokenizer = Tokenizer::FromJson(MinimalTokenizer({}), "minimal.json");
  ASSERT_TRUE(tokenizer.ok());
  for (const char* broken : {"\xFF", "a\xC3", "\xED\xA0\x80", "\xC0\xAF", "\xF4\x90\x80\x80"}) {
    auto ids = tokenizer->Encode(broken);
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument) << broken;
  }
}

}  // namespace
}  // namespace tandem::data
