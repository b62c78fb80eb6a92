// UTF-8 encoding of one code point, shared by the tokenizers and the Jinja interpreter.
#pragma once

#include <cstddef>
#include <cstdint>
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

// The offset of the first byte of `s` that does not begin a well-formed UTF-8 sequence (bad
// lead or continuation byte, an overlong form, a surrogate, past U+10FFFF, cut short), or -1
// when all of `s` is UTF-8.
inline std::ptrdiff_t invalid_utf8_offset(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range (RFC 3629's table)
    if (c < 0x80) len = 1;
    else if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return static_cast<std::ptrdiff_t>(i);
    }
    if (i + len > n) return static_cast<std::ptrdiff_t>(i);
    for (size_t k = 1; k < len; ++k) {
      const unsigned char b = p[i + k];
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return static_cast<std::ptrdiff_t>(i);
    }
    i += len;
  }
  return -1;
}

// "" when `s` is UTF-8, else what a reader's error says of it: the offset and value of the
// first bad byte.
inline std::string utf8_problem(std::string_view s) {
  const std::ptrdiff_t at = invalid_utf8_offset(s);
  if (at < 0) return "";
  static const char* kHex = "0123456789abcdef";
  const auto b = static_cast<unsigned char>(s[static_cast<size_t>(at)]);
  return "not valid UTF-8 (byte " + std::to_string(at) + " of the line is 0x" + kHex[b >> 4] + kHex[b & 15] +
         "); JSON text must be UTF-8: re-encode the file (for example with iconv)";
}

}  // namespace shardtrain::data
