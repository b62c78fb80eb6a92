// CRC32C: the reflected polynomial 0x82F63B78 with inverted start and end, by the SSE4.2
// instruction or a byte table; blocks joined by multiplying in GF(2)[x] modulo the polynomial.
#include "io/checksum.h"

#include <array>
#include <cstring>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define ST_CRC32C_X86 1
#endif

namespace shardtrain::io {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // reflected: bit 31 is x^0, bit 0 is x^31

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = make_table();

uint32_t table_update(uint32_t state, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) state = kTable[(state ^ p[i]) & 0xFF] ^ (state >> 8);
  return state;
}

#ifdef ST_CRC32C_X86
__attribute__((target("sse4.2"))) uint32_t instruction_update(uint32_t state, const uint8_t* p, size_t n) {
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    state = _mm_crc32_u8(state, *p++);
    --n;
  }
  uint64_t s = state;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    s = _mm_crc32_u64(s, word);
  }
  state = static_cast<uint32_t>(s);
  for (; n > 0; --n) state = _mm_crc32_u8(state, *p++);
  return state;
}

bool cpu_has_instruction() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

// a·b modulo the polynomial, both in the reflected form
uint32_t multiply(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t bit = 1u << 31; bit != 0; bit >>= 1) {
    if (a & bit) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPolynomial : b >> 1;  // b·x
  }
  return product;
}

// x^(8·bytes) modulo the polynomial: products of x^(2^k), k over the set bits of 8·bytes
uint32_t x_power_of_bytes(uint64_t bytes) {
  static const std::array<uint32_t, 64> powers = [] {
    std::array<uint32_t, 64> p{};
    p[0] = 1u << 30;  // x^1
    for (size_t k = 1; k < p.size(); ++k) p[k] = multiply(p[k - 1], p[k - 1]);
    return p;
  }();
  uint32_t result = 1u << 31;  // x^0
  // 8·bytes = bytes << 3: bit k of bytes is power k + 3
  for (int k = 0; bytes != 0 && k + 3 < 64; ++k, bytes >>= 1)
    if (bytes & 1) result = multiply(result, powers[static_cast<size_t>(k) + 3]);
  return result;
}

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
#ifdef ST_CRC32C_X86
  if (cpu_has_instruction()) return ~instruction_update(~crc, p, n);
#endif
  return ~table_update(~crc, p, n);
}

uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n) {
  return ~table_update(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  return multiply(x_power_of_bytes(length_b), crc_a) ^ crc_b;
}

uint32_t crc32c_parallel(const void* data, size_t n) {
  constexpr size_t kBlock = size_t{8} << 20;
#ifdef _OPENMP
  const bool one_thread = omp_in_parallel() || omp_get_max_threads() == 1;
#else
  const bool one_thread = true;  // a build without OpenMP (the fuzz target)
#endif
  if (n < kBlock || one_thread) return crc32c(0, data, n);
  const size_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<uint32_t> crcs(blocks);
  const auto* p = static_cast<const uint8_t*>(data);
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < blocks; ++b) {
    const size_t first = b * kBlock;
    crcs[b] = crc32c(0, p + first, std::min(kBlock, n - first));
  }
  uint32_t crc = crcs[0];
  for (size_t b = 1; b < blocks; ++b) crc = crc32c_combine(crc, crcs[b], std::min(kBlock, n - b * kBlock));
  return crc;
}

std::string format_crc32c(uint32_t crc) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(8, '0');
  for (int i = 7; i >= 0; --i, crc >>= 4) s[static_cast<size_t>(i)] = kHex[crc & 0xF];
  return s;
}

std::optional<uint32_t> parse_crc32c(const std::string& text) {
  if (text.size() != 8) return std::nullopt;
  uint32_t v = 0;
  for (char c : text) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return std::nullopt;
    v = (v << 4) | static_cast<uint32_t>(d);
  }
  return v;
}

}  // namespace shardtrain::io
