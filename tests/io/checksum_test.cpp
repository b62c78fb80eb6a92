// CRC32C: the standard check value, the CPU instruction against the table, joined blocks
// against one pass, and the text form.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io/checksum.h"

namespace shardtrain::io {
namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(n);
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

TEST(Crc32c, StandardCheckValues) {
  const char* digits = "123456789";
  EXPECT_EQ(crc32c(0, digits, 9), 0xE3069283u);  // the catalogue's check value of CRC-32C
  EXPECT_EQ(crc32c_portable(0, digits, 9), 0xE3069283u);
  EXPECT_EQ(crc32c(0, nullptr, 0), 0u);
  const std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(crc32c(0, zeros.data(), zeros.size()), 0x8A9136AAu);  // 32 zero bytes (RFC 3720 B.4)
  const std::vector<uint8_t> ones(32, 0xFF);
  EXPECT_EQ(crc32c(0, ones.data(), ones.size()), 0x62A8AB43u);
}

TEST(Crc32c, InstructionEqualsTableAtEveryAlignmentAndLength) {
  const std::vector<uint8_t> b = random_bytes(4096 + 64, 3);
  for (size_t start = 0; start < 9; ++start)
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63}, size_t{1000}, size_t{4096}})
      ASSERT_EQ(crc32c(0, b.data() + start, n), crc32c_portable(0, b.data() + start, n)) << start << " " << n;
}

TEST(Crc32c, ContinuingAndCombiningEqualOnePass) {
  const std::vector<uint8_t> b = random_bytes(100000, 5);
  const uint32_t whole = crc32c(0, b.data(), b.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{13}, size_t{4096}, size_t{65537}, b.size()}) {
    const uint32_t a = crc32c(0, b.data(), cut), c = crc32c(0, b.data() + cut, b.size() - cut);
    EXPECT_EQ(crc32c(a, b.data() + cut, b.size() - cut), whole) << cut;
    EXPECT_EQ(crc32c_combine(a, c, b.size() - cut), whole) << cut;
  }
}

TEST(Crc32c, ParallelBlocksEqualOnePass) {
  // 8 MiB blocks: three and a part
  const std::vector<uint8_t> b = random_bytes((size_t{8} << 20) * 3 + 12345, 7);
  EXPECT_EQ(crc32c_parallel(b.data(), b.size()), crc32c_portable(0, b.data(), b.size()));
}

TEST(Crc32c, AnyFlippedBitChangesIt) {
  std::vector<uint8_t> b = random_bytes(1 << 16, 9);
  const uint32_t before = crc32c(0, b.data(), b.size());
  for (size_t byte : {size_t{0}, size_t{777}, b.size() - 1})
    for (int bit = 0; bit < 8; ++bit) {
      b[byte] ^= static_cast<uint8_t>(1 << bit);
      EXPECT_NE(crc32c(0, b.data(), b.size()), before) << byte << ":" << bit;
      b[byte] ^= static_cast<uint8_t>(1 << bit);
    }
}

TEST(Crc32c, TextForm) {
  EXPECT_EQ(format_crc32c(0xE3069283u), "e3069283");
  EXPECT_EQ(format_crc32c(0x0000000Fu), "0000000f");
  EXPECT_EQ(parse_crc32c("e3069283"), 0xE3069283u);
  EXPECT_FALSE(parse_crc32c("E3069283").has_value());
  EXPECT_FALSE(parse_crc32c("e306928").has_value());
  EXPECT_FALSE(parse_crc32c("e306928g").has_value());
  EXPECT_FALSE(parse_crc32c("").has_value());
}

}  // namespace
}  // namespace shardtrain::io
