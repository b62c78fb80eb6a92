// UTF-8: encoding one code point, and finding where a text stops being UTF-8; shared by the
// tokenizers, the Jinja interpreter and the data readers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace shardtrain::data {

// Appends the UTF-8 encoding of `cp` (a Unicode scalar value) to `out`.
inline void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// The offset of the first byte of `s` that does not begin a well-formed UTF-8 sequence (a bad
// lead or continuation byte, an overlong form, a surrogate, past U+10FFFF, cut short: what
// PCRE2 requires), or npos when all of `s` is UTF-8. Eight ASCII bytes at a time.
inline size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, p + i, 8);
      if ((word & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + len > n || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

// "" when `s` is UTF-8, else what a reader's error says of it: the offset and value of the
// first bad byte.
inline std::string utf8_problem(std::string_view s) {
  const size_t at = find_invalid_utf8(s);
  if (at == std::string_view::npos) return "";
  static const char* kHex = "0123456789abcdef";
  const auto b = static_cast<unsigned char>(s[at]);
  return "not valid UTF-8 (byte " + std::to_string(at) + " of the line is 0x" + kHex[b >> 4] + kHex[b & 15] +
         "); JSON text must be UTF-8: re-encode the file (for example with iconv)";
}

}  // namespace shardtrain::data
