#include "data/internal/unicode_nfc.h"

#include <algorithm>
#include <utility>

namespace tandem::data::internal {
namespace {

// Hangul syllables: Unicode's arithmetic (section 3.12 of the standard).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

const Decomposition* FindDecomposition(char32_t code) {
  const Decomposition* end = kDecompositions + kDecompositionCount;
  const Decomposition* it = std::lower_bound(
      kDecompositions, end, code, [](const Decomposition& d, char32_t c) { return d.code < c; });
  return it != end && it->code == code ? it : nullptr;
}

void Decompose(char32_t code, std::vector<char32_t>* out) {
  if (code >= kSBase && code < kSBase + kSCount) {
    const char32_t index = code - kSBase;
    out->push_back(kLBase + index / kNCount);
    out->push_back(kVBase + (index % kNCount) / kTCount);
    if (index % kTCount != 0) out->push_back(kTBase + index % kTCount);
    return;
  }
  const Decomposition* d = code >= 0xC0 ? FindDecomposition(code) : nullptr;
  if (d == nullptr) {
    out->push_back(code);
    return;
  }
  Decompose(d->first, out);
  if (d->second != 0) Decompose(d->second, out);
}

// The primary composite of (first, second), or 0.
char32_t Compose(char32_t first, char32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase &&
      second < kVBase + kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 &&
      second > kTBase && second < kTBase + kTCount) {
    return first + (second - kTBase);
  }
  const Composition* end = kCompositions + kCompositionCount;
  const Composition* it =
      std::lower_bound(kCompositions, end, std::make_pair(first, second),
                       [](const Composition& c, const std::pair<char32_t, char32_t>& key) {
                         return std::make_pair(c.first, c.second) < key;
                       });
  return it != end && it->first == first && it->second == second ? it->composite : 0;
}

}  // namespace

int CombiningClass(char32_t code) {
  if (code < 0x300) return 0;
  const CombiningClassRange* end = kCombiningClasses + kCombiningClassCount;
  const CombiningClassRange* it =
      std::upper_bound(kCombiningClasses, end, code,
                       [](char32_t c, const CombiningClassRange& r) { return c < r.first; });
  if (it == kCombiningClasses) return 0;
  --it;
  return code <= it->last ? it->combining_class : 0;
}

void ToNfc(std::vector<char32_t>* codes) {
  // Below U+0300 nothing decomposes in a way NFC keeps, nothing combines with what precedes
  // it, and every class is 0: such a text is its own NFC.
  if (std::all_of(codes->begin(), codes->end(), [](char32_t c) { return c < 0x300; })) return;
  std::vector<char32_t> decomposed;
  decomposed.reserve(codes->size());
  for (const char32_t code : *codes) Decompose(code, &decomposed);
  // Canonical order: each run of non-starters sorted stably by class.
  std::vector<int> classes(decomposed.size());
  for (size_t i = 0; i < decomposed.size(); ++i) classes[i] = CombiningClass(decomposed[i]);
  for (size_t i = 0; i < decomposed.size();) {
    if (classes[i] == 0) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < decomposed.size() && classes[end] != 0) ++end;
    // Insertion sort: runs are short, and it is stable.
    for (size_t k = i + 1; k < end; ++k) {
      for (size_t j = k; j > i && classes[j - 1] > classes[j]; --j) {
        std::swap(classes[j - 1], classes[j]);
        std::swap(decomposed[j - 1], decomposed[j]);
      }
    }
    i = end;
  }
  // Canonical composition: a character joins the last starter if nothing between blocks it
  // (a character of class 0, or of a class at least its own).
  std::vector<char32_t>& out = *codes;
  out.clear();
  size_t starter = 0;
  bool have_starter = false;
  int last_class = -1;  // of the last character kept after the starter; -1: none
  for (size_t i = 0; i < decomposed.size(); ++i) {
    const char32_t code = decomposed[i];
    const int cc = classes[i];
    if (have_starter && (last_class == -1 || (last_class != 0 && last_class < cc))) {
      if (const char32_t composite = Compose(out[starter], code); composite != 0) {
        out[starter] = composite;
        continue;
      }
    }
    if (cc == 0) {
      starter = out.size();
      have_starter = true;
      last_class = -1;
    } else {
      last_class = cc;
    }
    out.push_back(code);
  }
}

}  // namespace tandem::data::internal
