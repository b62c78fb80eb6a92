// Decompressing the codecs of Parquet pages: snappy and LZ4 blocks decoded here (every length
// and back-reference checked against both buffers), gzip through zlib and zstd through libzstd.
// The caller knows the exact decompressed size; anything that does not decode to exactly that
// many bytes is an error naming `what`.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace shardtrain::io {

// Parquet's CompressionCodec numbering.
enum class Codec : int32_t {
  kUncompressed = 0,
  kSnappy = 1,
  kGzip = 2,
  kLzo = 3,
  kBrotli = 4,
  kLz4Hadoop = 5,  // the deprecated LZ4: Hadoop's framing around LZ4 blocks
  kZstd = 6,
  kLz4Raw = 7,
};

// "SNAPPY", "ZSTD", ..., or "codec N" for numbers outside the enum.
std::string codec_name(int32_t codec);

// Decompresses `in` into exactly out.size() bytes. Throws naming `what` for an unsupported
// codec (LZO, Brotli), corrupt data, or a decoded size other than out.size().
void decompress(Codec codec, std::span<const uint8_t> in, std::span<uint8_t> out, const std::string& what);

// The raw block formats, exposed for tests.
void snappy_decompress(std::span<const uint8_t> in, std::span<uint8_t> out, const std::string& what);
void lz4_block_decompress(std::span<const uint8_t> in, std::span<uint8_t> out, const std::string& what);

}  // namespace shardtrain::io
