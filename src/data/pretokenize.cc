// GPT-2's pre-tokenization pattern, as a hand-written scanner over UTF-8:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with the regex's leftmost-first alternation. Character classes come from ICU (Unicode
// general categories L* and N*, the White_Space property), tabulated once for every code
// point so the scan is a table lookup per character.
#include <unicode/uchar.h>

#include <array>
#include <memory>

#include "loom/data/tokenizer.h"

namespace loom::data {
namespace {

enum CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };
constexpr char32_t kCodePoints = 0x110000;

const uint8_t* class_table() {
  static const std::unique_ptr<uint8_t[]> table = [] {
    auto t = std::make_unique<uint8_t[]>(kCodePoints);
    for (char32_t c = 0; c < kCodePoints; ++c) {
      const auto ch = static_cast<UChar32>(c);
      if (u_hasBinaryProperty(ch, UCHAR_WHITE_SPACE)) {
        t[c] = kSpace;
        continue;
      }
      switch (u_charType(ch)) {
        case U_UPPERCASE_LETTER: case U_LOWERCASE_LETTER: case U_TITLECASE_LETTER:
        case U_MODIFIER_LETTER: case U_OTHER_LETTER:
          t[c] = kLetter;
          break;
        case U_DECIMAL_DIGIT_NUMBER: case U_LETTER_NUMBER: case U_OTHER_NUMBER:
          t[c] = kNumber;
          break;
        default:
          t[c] = kOther;
      }
    }
    return t;
  }();
  return table.get();
}

// One character at s[i]: its class and length in bytes. A byte that does not start a
// valid UTF-8 sequence (overlong, surrogate, past U+10FFFF, cut short) is one character
// of class kOther.
struct Char {
  uint8_t cls;
  uint8_t len;
};

inline Char char_at(const uint8_t* table, std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {table[b0], 1};
  const size_t left = s.size() - i;
  auto cont = [&](size_t k) { return k < left && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80; };
  auto at = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[i + k]) & 0x3F); };
  if (b0 >= 0xC2 && b0 <= 0xDF && cont(1)) return {table[((b0 & 0x1Fu) << 6) | at(1)], 2};
  if (b0 >= 0xE0 && b0 <= 0xEF && cont(1) && cont(2)) {
    const char32_t c = ((b0 & 0x0Fu) << 12) | (at(1) << 6) | at(2);
    if (c >= 0x800 && (c < 0xD800 || c > 0xDFFF)) return {table[c], 3};
  }
  if (b0 >= 0xF0 && b0 <= 0xF4 && cont(1) && cont(2) && cont(3)) {
    const char32_t c = ((b0 & 0x07u) << 18) | (at(1) << 12) | (at(2) << 6) | at(3);
    if (c >= 0x10000 && c < kCodePoints) return {table[c], 4};
  }
  return {kOther, 1};
}

// The contraction ('s 't 're 've 'm 'll 'd) at s[i] == '\'', or 0.
inline size_t contraction(std::string_view s, size_t i) {
  if (i + 1 >= s.size()) return 0;
  const char a = s[i + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= s.size()) return 0;
  const char b = s[i + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

}  // namespace

void pretokenize(std::string_view s, std::vector<std::string_view>& pieces) {
  const uint8_t* table = class_table();
  size_t i = 0;
  const size_t n = s.size();
  // The end of the run of characters of class `cls` starting at j.
  auto run_end = [&](size_t j, uint8_t cls) {
    while (j < n) {
      const Char c = char_at(table, s, j);
      if (c.cls != cls) break;
      j += c.len;
    }
    return j;
  };
  while (i < n) {
    if (s[i] == '\'') {
      if (const size_t len = contraction(s, i); len > 0) {
        pieces.push_back(s.substr(i, len));
        i += len;
        continue;
      }
    }
    Char c = char_at(table, s, i);
    size_t start = i, j = i;
    if (s[i] == ' ' && i + 1 < n) {  // " ?X+": a space joins the run of letters, numbers or symbols after it
      const Char next = char_at(table, s, i + 1);
      if (next.cls != kSpace) {
        c = next;
        j = i + 1;
      }
    }
    if (c.cls != kSpace) {
      const size_t end = run_end(j, c.cls);
      pieces.push_back(s.substr(start, end - start));
      i = end;
      continue;
    }
    // Whitespace: \s+(?!\S) takes the run but its last character when a non-space follows
    // (that character then leads the next piece); a lone whitespace character before a
    // non-space is \s+.
    size_t end = i, last = i, count = 0;
    while (end < n) {
      const Char w = char_at(table, s, end);
      if (w.cls != kSpace) break;
      last = end;
      end += w.len;
      ++count;
    }
    if (end < n && count >= 2) end = last;
    pieces.push_back(s.substr(i, end - i));
    i = end;
  }
}

}  // namespace loom::data
