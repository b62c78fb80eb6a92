// CRC32C (the Castagnoli polynomial, as in iSCSI, ext4 and most storage formats): the checksum
// shardtrain writes beside every tensor of a safetensors file it saves and verifies when the
// tensor is read. x86's SSE4.2 instruction computes it where the CPU has it (about 8 GB/s per
// thread), a table elsewhere; large buffers are split into blocks checksummed on every thread
// and joined with crc32c_combine, so the result is the same as one pass over the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace shardtrain::io {

// The CRC32C of `n` bytes at `data`, continuing from `crc` (the checksum of the bytes before;
// 0 for none): crc32c(crc32c(0, a), b) is the checksum of a followed by b.
uint32_t crc32c(uint32_t crc, const void* data, size_t n);

// The same with the table, never the CPU instruction (a check of the fast path).
uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n);

// The checksum of a followed by b from crc32c(0, a), crc32c(0, b) and b's length.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b);

// crc32c(0, data, n) computed on all OpenMP threads for large buffers (one thread below 8 MiB,
// or when called inside a parallel region).
uint32_t crc32c_parallel(const void* data, size_t n);

// The text form written in files: 8 lower-case hex digits; parse_crc32c returns nothing for
// anything else.
std::string format_crc32c(uint32_t crc);
std::optional<uint32_t> parse_crc32c(const std::string& text);

}  // namespace shardtrain::io
